"""Subscriptions and the state of each (alert, subscription) delivery, in a private SQLite file.

Every URL is a secret, so this is not the shared database: the file is mode 0600, owned by the
user (per-user mode) or by the notify service (system mode), and holds alert ids, never their
text. A subscription only ever matches alerts whose uid is its owner's; admin-wide ones (uid
NULL, from the root-only file) match GPU and host alerts and every user's gpu.idle_held.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.alerts import GPU_KINDS, KINDS, RUN_KINDS
from gpuwatch.alerts.redact import redact
from gpuwatch.store import now_ms
from gpuwatch.store.alerts import Alert

# The kinds that end a run: a `run --notify` subscription is done once one is delivered.
END_KINDS = ("run.finished", "run.failed", "run.oom", "run.lost")
# What an admin-wide subscription may receive (a run's own alerts are its owner's business).
ADMIN_KINDS = GPU_KINDS + ("disk.low",)
DEFAULT_KINDS = RUN_KINDS

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscriptions (
  id INTEGER PRIMARY KEY,
  uid INTEGER,                             -- its owner; NULL: admin-wide, from the root-only file
  url TEXT NOT NULL,                       -- the secret
  kinds TEXT NOT NULL,                     -- comma-separated alert kinds
  run_name TEXT, run_id TEXT,              -- only this run (by name, or the one `run --notify` started)
  transient INTEGER NOT NULL DEFAULT 0,    -- `gpuwatch run --notify`: removed once its run's end is delivered
  after_alert_id INTEGER NOT NULL DEFAULT 0,  -- alerts up to this id came before it
  created_ms INTEGER NOT NULL,
  last_sent_ms INTEGER NOT NULL DEFAULT 0  -- for grouping: one message per window
);
CREATE TABLE IF NOT EXISTS deliveries (
  alert_id INTEGER NOT NULL,
  sub_id INTEGER NOT NULL,
  kind TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending',   -- pending | sent
  attempts INTEGER NOT NULL DEFAULT 0,
  next_try_ms INTEGER NOT NULL DEFAULT 0,
  sent_ms INTEGER,
  last_error TEXT,                         -- our own words, never the URL
  PRIMARY KEY (alert_id, sub_id)
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (state, next_try_ms);
CREATE TABLE IF NOT EXISTS cursor (id INTEGER PRIMARY KEY CHECK (id = 1), alert_id INTEGER NOT NULL);
"""


class SubscriptionError(ValueError):
    """A request that cannot be done; the message is one line saying why."""


@dataclass(frozen=True)
class Subscription:
    id: int
    uid: int | None
    url: str
    kinds: tuple[str, ...]
    run_name: str | None = None
    run_id: str | None = None
    transient: bool = False
    after_alert_id: int = 0
    created_ms: int = 0
    last_sent_ms: int = 0

    @property
    def redacted(self) -> str:
        return redact(self.url)

    def public(self) -> dict:
        """What its owner may be shown: everything but the URL itself."""
        return {
            "id": self.id,
            "url": self.redacted,
            "on": list(self.kinds),
            "run": self.run_name,
            "run_id": self.run_id,
            "admin": self.uid is None,
            "uid": self.uid,
            "transient": self.transient,
            "created_ms": self.created_ms,
        }

    def matches(self, alert: Alert, run_name: str | None) -> bool:
        if alert.id is None or alert.id <= self.after_alert_id or alert.kind not in self.kinds:
            return False
        if self.uid is None:
            return alert.uid is None or alert.kind == "gpu.idle_held"
        if alert.uid != self.uid:
            return False
        if self.run_id and alert.run_id != self.run_id:
            return False
        return not self.run_name or run_name == self.run_name


def open_store(path: Path) -> sqlite3.Connection:
    """Open (creating, mode 0600 in a 0700 directory) the private file."""
    path = Path(path)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))  # SQLite gives -wal/-shm the same mode
    if os.stat(path).st_mode & 0o077:
        raise SubscriptionError(f"{path} is readable by other users; it holds secrets (chmod 600 {path})")
    conn = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(_SCHEMA)
    return conn


def parse_kinds(text: str | None, allowed=KINDS, default=DEFAULT_KINDS) -> tuple[str, ...]:
    """'run.failed,run.oom' or 'run.*' -> the kinds; an unknown one is an error naming it."""
    if not text:
        return tuple(default)
    kinds: list[str] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        chosen = (
            [k for k in allowed if k.startswith(word[:-1])]
            if word.endswith("*")
            else [word]
            if word in allowed
            else []
        )
        if not chosen:
            raise SubscriptionError(f"unknown alert kind {word!r} (kinds: {', '.join(allowed)})")
        kinds += [k for k in chosen if k not in kinds]
    return tuple(kinds)


_COLUMNS = "id, uid, url, kinds, run_name, run_id, transient, after_alert_id, created_ms, last_sent_ms"


def _build(row) -> Subscription:
    return Subscription(
        id=row[0],
        uid=row[1],
        url=row[2],
        kinds=tuple(row[3].split(",")),
        run_name=row[4],
        run_id=row[5],
        transient=bool(row[6]),
        after_alert_id=row[7],
        created_ms=row[8],
        last_sent_ms=row[9],
    )


def add(
    conn: sqlite3.Connection,
    uid: int | None,
    url: str,
    kinds: tuple[str, ...],
    run_name: str | None = None,
    run_id: str | None = None,
    transient: bool = False,
    after_alert_id: int = 0,
) -> Subscription:
    cur = conn.execute(
        "INSERT INTO subscriptions (uid, url, kinds, run_name, run_id, transient, after_alert_id, "
        "created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (uid, url, ",".join(kinds), run_name, run_id, int(transient), after_alert_id, now_ms()),
    )
    return get(conn, int(cur.lastrowid or 0))


def get(conn: sqlite3.Connection, sub_id: int) -> Subscription:
    row = conn.execute(f"SELECT {_COLUMNS} FROM subscriptions WHERE id = ?", (sub_id,)).fetchone()
    if row is None:
        raise SubscriptionError(f"no subscription {sub_id}")
    return _build(row)


def listing(conn: sqlite3.Connection, uid: int | None) -> list[Subscription]:
    """`uid`'s subscriptions; with None (root), everyone's and the admin-wide ones."""
    if uid is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM subscriptions ORDER BY id")
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM subscriptions WHERE uid = ? ORDER BY id", (uid,))
    return [_build(r) for r in rows]


def mine(conn: sqlite3.Connection, sub_id: int, uid: int | None) -> Subscription:
    """Subscription `sub_id` if `uid` owns it (None: root, any); else the same error as for a
    missing one, so another user's ids cannot be probed."""
    try:
        sub = get(conn, sub_id)
    except SubscriptionError:
        sub = None
    if sub is None or (uid is not None and sub.uid != uid):
        raise SubscriptionError(f"no subscription {sub_id} of yours (see `gpuwatch notify list`)")
    return sub


def remove(conn: sqlite3.Connection, sub_id: int, uid: int | None) -> Subscription:
    sub = mine(conn, sub_id, uid)
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM deliveries WHERE sub_id = ? AND state = 'pending'", (sub_id,))
        conn.execute("DELETE FROM subscriptions WHERE id = ?", (sub_id,))
    return sub


def sync_admin(
    conn: sqlite3.Connection, entries: list[tuple[str, tuple[str, ...]]], after_alert_id: int
) -> None:
    """Make the admin-wide rows the file's (url, kinds) list; unchanged ones keep their state."""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        current = {
            (r[1], r[2]): r[0]
            for r in conn.execute("SELECT id, url, kinds FROM subscriptions WHERE uid IS NULL")
        }
        wanted = {(url, ",".join(kinds)) for url, kinds in entries}
        for key, sub_id in current.items():
            if key not in wanted:
                conn.execute("DELETE FROM deliveries WHERE sub_id = ? AND state = 'pending'", (sub_id,))
                conn.execute("DELETE FROM subscriptions WHERE id = ?", (sub_id,))
        for url, kinds in wanted - set(current):
            conn.execute(
                "INSERT INTO subscriptions (uid, url, kinds, after_alert_id, created_ms) "
                "VALUES (NULL, ?, ?, ?, ?)",
                (url, kinds, after_alert_id, now_ms()),
            )


def deliveries_of(conn: sqlite3.Connection, alert_ids: list[int], uid: int | None) -> dict[int, list[dict]]:
    """{alert id: [{sub, url (redacted), state, attempts, sent_ms}]} for `uid`'s subscriptions
    (None: root, all of them)."""
    if not alert_ids:
        return {}
    marks = ",".join("?" * len(alert_ids))
    sql = (
        f"SELECT d.alert_id, s.id, s.url, d.state, d.attempts, d.sent_ms FROM deliveries d "
        f"JOIN subscriptions s ON s.id = d.sub_id WHERE d.alert_id IN ({marks})"
    )
    args: list = list(alert_ids)
    if uid is not None:
        sql += " AND s.uid = ?"
        args.append(uid)
    out: dict[int, list[dict]] = {}
    for alert_id, sub_id, url, state, attempts, sent_ms in conn.execute(sql + " ORDER BY s.id", args):
        out.setdefault(alert_id, []).append(
            {"sub": sub_id, "url": redact(url), "state": state, "attempts": attempts, "sent_ms": sent_ms}
        )
    return out

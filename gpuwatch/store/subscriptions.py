"""The private notify store: subscriptions, and the state of each (alert, subscription) delivery
(store/deliveries.py), in a SQLite file of their own.

Every URL is a secret, so this is not the shared database: the file is mode 0600, owned by the
user (per-user mode) or by the notify service (system mode), and holds alert ids, never their
text. Who may see or receive what is gpuwatch/alerts/subscriptions.py's business.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gpuwatch.base.clock import now_ms

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


_COLUMNS = ", ".join(f.name for f in fields(Subscription))


def _build(row: tuple[Any, ...]) -> Subscription:
    id_, uid, url, kinds, run_name, run_id, transient, after_alert_id, created_ms, last_sent_ms = row
    return Subscription(
        id_,
        uid,
        url,
        tuple(kinds.split(",")),
        run_name,
        run_id,
        bool(transient),
        after_alert_id,
        created_ms,
        last_sent_ms,
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
    created = now_ms()
    cur = conn.execute(
        "INSERT INTO subscriptions (uid, url, kinds, run_name, run_id, transient, after_alert_id, "
        "created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (uid, url, ",".join(kinds), run_name, run_id, int(transient), after_alert_id, created),
    )
    sub_id = int(cur.lastrowid or 0)  # an INSERT into a rowid table always sets it
    return Subscription(sub_id, uid, url, tuple(kinds), run_name, run_id, transient, after_alert_id, created)


def get(conn: sqlite3.Connection, sub_id: int) -> Subscription | None:
    row = conn.execute(f"SELECT {_COLUMNS} FROM subscriptions WHERE id = ?", (sub_id,)).fetchone()
    return None if row is None else _build(row)


def listing(conn: sqlite3.Connection, uid: int | None) -> list[Subscription]:
    """`uid`'s subscriptions; with None, everyone's and the admin-wide ones."""
    if uid is None:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM subscriptions ORDER BY id")
    else:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM subscriptions WHERE uid = ? ORDER BY id", (uid,))
    return [_build(r) for r in rows]


def _drop(conn: sqlite3.Connection, sub_id: int) -> None:
    """The subscription and what it has not been sent yet (sent rows stay, for `gpuwatch alerts`)."""
    conn.execute("DELETE FROM deliveries WHERE sub_id = ? AND state = 'pending'", (sub_id,))
    conn.execute("DELETE FROM subscriptions WHERE id = ?", (sub_id,))


def remove(conn: sqlite3.Connection, sub_id: int) -> None:
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        _drop(conn, sub_id)


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
                _drop(conn, sub_id)
        for url, kinds in wanted - set(current):
            conn.execute(
                "INSERT INTO subscriptions (uid, url, kinds, after_alert_id, created_ms) "
                "VALUES (NULL, ?, ?, ?, ?)",
                (url, kinds, after_alert_id, now_ms()),
            )


def forget_delivered_transients(conn: sqlite3.Connection, end_kinds: tuple[str, ...]) -> None:
    """Remove the `run --notify` subscriptions whose run's end (an alert of `end_kinds`) was
    sent and that have nothing pending."""
    ends = ",".join("?" * len(end_kinds))
    with conn:
        conn.execute(
            f"DELETE FROM subscriptions WHERE transient = 1 AND id IN (SELECT sub_id FROM deliveries "
            f"WHERE state = 'sent' AND kind IN ({ends})) AND id NOT IN "
            f"(SELECT sub_id FROM deliveries WHERE state = 'pending')",
            end_kinds,
        )

"""Delivery: match new alert rows to subscriptions, send each subscription its pending alerts
through apprise, and keep every (alert, subscription) state in the private store.

Once, never lost: an alert is matched into `deliveries` (pending) in the same transaction that
moves the cursor past it, and marked sent right after apprise says it arrived; a failure is
retried with exponential back-off capped at 60 s, across restarts. Grouped: a subscription
gets at most one message per `notify_group_seconds`; alerts that come in between go out
together. Only one deliverer works a store at a time (an flock beside it), so a user daemon
and a `gpuwatch run` wrapper never both send.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpuwatch.alerts import subscriptions as subs
from gpuwatch.store import StoreError, now_ms, open_ro
from gpuwatch.store import alerts as store_alerts
from gpuwatch.store.alerts import Alert

log = logging.getLogger("gpuwatch.alerts")
MAX_BACKOFF_S = 60.0
KEEP_SENT_MS = 30 * 86400 * 1000  # sent rows are kept a month, for `gpuwatch alerts`


def backoff_s(attempts: int) -> float:
    """1, 2, 4 ... seconds after the 1st, 2nd, 3rd failed try, never more than 60."""
    return min(MAX_BACKOFF_S, 2.0 ** max(0, attempts - 1))


def _quiet_apprise():
    import apprise

    # apprise logs failures with the target in them: our logs never show a URL.
    quiet = logging.getLogger("apprise")
    quiet.propagate = False
    quiet.handlers[:] = [logging.NullHandler()]
    return apprise


def check_url(url: str) -> None:
    """Raise SubscriptionError unless apprise can send to `url` (the message never quotes it)."""
    apprise = _quiet_apprise()
    if not isinstance(url, str) or not url or apprise.Apprise.instantiate(url) is None:
        raise subs.SubscriptionError(
            "not a notification URL apprise understands (e.g. slack://…, ntfy://…, mailto://…, "
            "json://host/path; see https://github.com/caronc/apprise/wiki)"
        )


def send(url: str, title: str, body: str) -> str | None:
    """Send one message; None when it arrived, else why not (in our words, without the URL)."""
    apprise = _quiet_apprise()
    target = apprise.Apprise()
    if not target.add(url):
        return "not a URL apprise understands"
    try:
        ok = target.notify(title=title, body=body)
    except Exception as e:  # a plugin's bug must not stop delivery to everyone else
        return f"apprise failed: {type(e).__name__}"
    return None if ok else "the endpoint did not accept it"


def compose(alerts: list[Alert]) -> tuple[str, str]:
    """One message for one or several alerts of a subscription."""
    if len(alerts) == 1:
        return alerts[0].title, alerts[0].body
    hosts = sorted({a.host for a in alerts})
    title = f"gpuwatch: {len(alerts)} alerts on {', '.join(hosts)}"
    body = "\n\n".join(f"▸ {a.title}\n{a.body}" for a in alerts)
    return title, body


def max_alert_id(db_path: Path) -> int:
    """The newest alert's id in the shared database; 0 when there is none (yet)."""
    try:
        conn = open_ro(db_path)
    except StoreError:
        return 0
    try:
        return conn.execute("SELECT COALESCE(MAX(id), 0) FROM alerts").fetchone()[0]
    finally:
        conn.close()


class Deliverer:
    """Works one private store against one shared database; `deliver_once` is a whole pass."""

    def __init__(
        self,
        store_path: Path,
        db_path: Path,
        group_s: float = 5.0,
        sender=send,
        workers: int = 8,
        terminals_uid: int | None = None,
    ):
        self.store_path = Path(store_path)
        self.db_path = Path(db_path)
        self.group_ms = int(group_s * 1000)
        self.sender = sender
        self.workers = workers
        self.terminals_uid = terminals_uid  # also a line on this user's terminals (their own deliverer)
        self.conn = subs.open_store(self.store_path)
        self._main: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.messages_sent = 0
        self._pruned_ms = 0

    # -- the one-deliverer lock ------------------------------------------------------------
    def owns_store(self) -> bool:
        """True while this deliverer is the one working its store (taken on first call)."""
        if self._lock_fd is None:
            fd = os.open(f"{self.store_path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            self._lock_fd = fd
        return True

    def _shared_db(self) -> sqlite3.Connection | None:
        if self._main is None:
            try:
                self._main = open_ro(self.db_path)
            except StoreError:
                return None  # no database yet: nothing has fired
        return self._main

    # -- a pass ----------------------------------------------------------------------------
    def deliver_once(self) -> int:
        """Match new alerts, send what is due; the number of messages that arrived."""
        if not self.owns_store():
            return 0
        main = self._shared_db()
        if main is None:
            return 0
        self._match(main)
        sent = self._send_due(main)
        if now_ms() - self._pruned_ms > 3600_000:
            self._pruned_ms = now_ms()
            with self.conn:
                self.conn.execute(
                    "DELETE FROM deliveries WHERE state = 'sent' AND sent_ms < ?",
                    (self._pruned_ms - KEEP_SENT_MS,),
                )
        return sent

    def _match(self, main: sqlite3.Connection) -> None:
        row = self.conn.execute("SELECT alert_id FROM cursor WHERE id = 1").fetchone()
        all_subs = subs.listing(self.conn, None)
        if row is None:  # a new store: start at its subscriptions, or now
            start = min(
                (s.after_alert_id for s in all_subs),
                default=main.execute("SELECT COALESCE(MAX(id), 0) FROM alerts").fetchone()[0],
            )
            self.conn.execute("INSERT INTO cursor (id, alert_id) VALUES (1, ?)", (start,))
            cursor = start
        else:
            cursor = row[0]
        new = store_alerts.since(main, cursor)
        if not new:
            return
        names: dict[str, str | None] = {}
        for alert in new:
            if alert.run_id and alert.run_id not in names:
                found = main.execute("SELECT name FROM runs WHERE run_id = ?", (alert.run_id,)).fetchone()
                names[alert.run_id] = found[0] if found else None
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            for alert in new:
                for sub in all_subs:
                    if sub.matches(alert, names.get(alert.run_id or "")):
                        self.conn.execute(
                            "INSERT OR IGNORE INTO deliveries (alert_id, sub_id, kind) VALUES (?, ?, ?)",
                            (alert.id, sub.id, alert.kind),
                        )
            self.conn.execute("UPDATE cursor SET alert_id = ? WHERE id = 1", (new[-1].id,))
        if self.terminals_uid is not None:
            from gpuwatch.alerts.terminals import write_line

            for alert in new:
                if alert.uid == self.terminals_uid:
                    write_line(alert.title, alert.uid)

    def _send_due(self, main: sqlite3.Connection) -> int:
        now = now_ms()
        due: dict[int, list[int]] = {}
        for sub_id, alert_id in self.conn.execute(
            "SELECT d.sub_id, d.alert_id FROM deliveries d JOIN subscriptions s ON s.id = d.sub_id "
            "WHERE d.state = 'pending' AND d.next_try_ms <= ? AND s.last_sent_ms + ? <= ? "
            "ORDER BY d.sub_id, d.alert_id",
            (now, self.group_ms, now),
        ):
            due.setdefault(sub_id, []).append(alert_id)
        if not due:
            return 0
        wanted = sorted({a for ids in due.values() for a in ids})
        texts = {a.id: a for a in store_alerts.by_ids(main, wanted)}
        jobs = []
        for sub_id, alert_ids in due.items():
            sub = subs.get(self.conn, sub_id)
            present = [texts[a] for a in alert_ids if a in texts]
            jobs.append((sub, alert_ids, present))
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs))) as pool:
            results = list(pool.map(self._send_job, jobs))
        sent = 0
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            done = now_ms()
            for (sub, alert_ids, _), error in zip(jobs, results):
                marks = ",".join("?" * len(alert_ids))
                if error is None:
                    sent += 1
                    self.conn.execute(
                        f"UPDATE deliveries SET state = 'sent', sent_ms = ?, attempts = "
                        f"attempts + 1, last_error = NULL WHERE sub_id = ? AND alert_id "
                        f"IN ({marks})",
                        (done, sub.id, *alert_ids),
                    )
                    self.conn.execute(
                        "UPDATE subscriptions SET last_sent_ms = ? WHERE id = ?", (done, sub.id)
                    )
                else:
                    for alert_id, attempts in self.conn.execute(
                        f"SELECT alert_id, attempts FROM deliveries WHERE sub_id = ? AND alert_id "
                        f"IN ({marks})",
                        (sub.id, *alert_ids),
                    ).fetchall():
                        self.conn.execute(
                            "UPDATE deliveries SET attempts = ?, next_try_ms = ?, last_error = ? "
                            "WHERE sub_id = ? AND alert_id = ?",
                            (
                                attempts + 1,
                                done + int(backoff_s(attempts + 1) * 1000),
                                error,
                                sub.id,
                                alert_id,
                            ),
                        )
                    log.warning(
                        "alert delivery to subscription %d (%s) failed, will retry: %s",
                        sub.id,
                        sub.redacted,
                        error,
                    )
        self.messages_sent += sent
        if sent:
            self._forget_finished_transients()
        return sent

    def _send_job(self, job) -> str | None:
        sub, _, alerts = job
        if not alerts:  # the shared database lost them (replaced or pruned): nothing to send
            return None
        return self.sender(sub.url, *compose(alerts))

    def _forget_finished_transients(self) -> None:
        ends = ",".join("?" * len(subs.END_KINDS))
        with self.conn:
            self.conn.execute(
                f"DELETE FROM subscriptions WHERE transient = 1 AND id IN (SELECT sub_id FROM deliveries "
                f"WHERE state = 'sent' AND kind IN ({ends})) AND id NOT IN "
                f"(SELECT sub_id FROM deliveries WHERE state = 'pending')",
                subs.END_KINDS,
            )

    def pending(self, run_id: str | None = None) -> int:
        """Deliveries still waiting (for one run's `--notify` subscription, or all)."""
        if run_id is None:
            return self.conn.execute("SELECT count(*) FROM deliveries WHERE state = 'pending'").fetchone()[0]
        return self.conn.execute(
            "SELECT count(*) FROM deliveries d JOIN subscriptions s ON s.id = d.sub_id "
            "WHERE d.state = 'pending' AND s.run_id = ?",
            (run_id,),
        ).fetchone()[0]

    # -- as a thread -----------------------------------------------------------------------
    def start(self, interval_s: float = 0.5) -> None:
        self._thread = threading.Thread(
            target=self.run, args=(interval_s,), name="gpuwatch-deliver", daemon=True
        )
        self._thread.start()

    def run(self, interval_s: float = 0.5) -> None:
        """Pass after pass until stop(); a failed pass is logged and the next one tries again."""
        while not self._stop.is_set():
            try:
                self.deliver_once()
            except (sqlite3.Error, OSError) as e:
                log.error("alert delivery pass failed (will retry): %s", e)
                self._close_main()
            self._stop.wait(interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.close()

    def _close_main(self) -> None:
        if self._main is not None:
            self._main.close()
            self._main = None

    def close(self) -> None:
        self._close_main()
        self.conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

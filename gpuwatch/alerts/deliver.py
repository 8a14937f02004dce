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
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable

from gpuwatch.alerts import subscriptions as subs
from gpuwatch.alerts.redact import redact
from gpuwatch.store import SQLiteError, StoreError, deliveries, now_ms, open_ro
from gpuwatch.store import alerts as store_alerts
from gpuwatch.store import subscriptions as stored_subs
from gpuwatch.store.alerts import Alert
from gpuwatch.store.queries import run_names
from gpuwatch.store.subscriptions import Subscription

if TYPE_CHECKING:
    import sqlite3

log = logging.getLogger("gpuwatch.alerts")
MAX_BACKOFF_S = 60.0
KEEP_SENT_MS = 30 * 86400 * 1000  # sent rows are kept a month, for `gpuwatch alerts`


def backoff_s(attempts: int) -> float:
    """1, 2, 4 ... seconds after the 1st, 2nd, 3rd failed try, never more than 60."""
    return min(MAX_BACKOFF_S, 2.0 ** max(0, attempts - 1))


def _quiet_apprise() -> ModuleType:
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
        return store_alerts.max_id(conn)
    finally:
        conn.close()


class Deliverer:
    """Works one private store against one shared database; `deliver_once` is a whole pass."""

    def __init__(
        self,
        store_path: Path,
        db_path: Path,
        group_s: float = 5.0,
        sender: Callable[[str, str, str], str | None] = send,
        workers: int = 8,
        terminals_uid: int | None = None,
    ):
        self.store_path = Path(store_path)
        self.db_path = Path(db_path)
        self.group_ms = int(group_s * 1000)
        self.sender = sender
        self.workers = workers
        self.terminals_uid = terminals_uid  # also a line on this user's terminals (their own deliverer)
        self.conn = stored_subs.open_store(self.store_path)
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
            deliveries.prune_sent(self.conn, self._pruned_ms - KEEP_SENT_MS)
        return sent

    def _match(self, main: sqlite3.Connection) -> None:
        cursor = deliveries.cursor(self.conn)
        all_subs = stored_subs.listing(self.conn, None)
        if cursor is None:  # a new store: start at its subscriptions, or now
            cursor = min((s.after_alert_id for s in all_subs), default=store_alerts.max_id(main))
            deliveries.start_cursor(self.conn, cursor)
        new = store_alerts.since(main, cursor)
        if not new:
            return
        names = run_names(main, {a.run_id for a in new if a.run_id})
        matched = [
            (alert.id, sub.id, alert.kind)
            for alert in new
            if alert.id is not None  # stored alerts have one
            for sub in all_subs
            if subs.matches(sub, alert, names.get(alert.run_id or ""))
        ]
        deliveries.queue(self.conn, matched, new[-1].id or cursor)
        if self.terminals_uid is not None:
            from gpuwatch.alerts.terminals import write_line

            for alert in new:
                if alert.uid == self.terminals_uid:
                    write_line(alert.title, alert.uid)

    def _send_due(self, main: sqlite3.Connection) -> int:
        due = deliveries.due(self.conn, now_ms(), self.group_ms)
        if not due:
            return 0
        wanted = sorted({a for ids in due.values() for a in ids})
        texts = {a.id: a for a in store_alerts.by_ids(main, wanted)}
        by_id = {s.id: s for s in stored_subs.listing(self.conn, None)}
        jobs = [
            (by_id[sub_id], alert_ids, [texts[a] for a in alert_ids if a in texts])
            for sub_id, alert_ids in due.items()
            if sub_id in by_id  # else removed since: its pending rows went with it
        ]
        if not jobs:
            return 0
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs))) as pool:
            results = list(pool.map(self._send_job, jobs))
        deliveries.record_tries(
            self.conn,
            [(sub.id, alert_ids, error) for (sub, alert_ids, _), error in zip(jobs, results)],
            now_ms(),
            backoff_s,
        )
        for (sub, _, _), error in zip(jobs, results):
            if error is not None:
                log.warning(
                    "alert delivery to subscription %d (%s) failed, will retry: %s",
                    sub.id,
                    redact(sub.url),
                    error,
                )
        sent = results.count(None)
        self.messages_sent += sent
        if sent:
            stored_subs.forget_delivered_transients(self.conn, subs.END_KINDS)
        return sent

    def _send_job(self, job: tuple[Subscription, list[int], list[Alert]]) -> str | None:
        sub, _, alerts = job
        if not alerts:  # the shared database lost them (replaced or pruned): nothing to send
            return None
        return self.sender(sub.url, *compose(alerts))

    def pending(self, run_id: str | None = None) -> int:
        """Deliveries still waiting (for one run's `--notify` subscription, or all)."""
        return deliveries.pending(self.conn, run_id)

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
            except (SQLiteError, OSError) as e:
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

"""The state of each (alert, subscription) delivery in the private notify store (its schema is
in store/subscriptions.py), and the cursor past the shared database's alerts already matched.

gpuwatch/alerts/deliver.py decides what to send and when to retry; these keep its decisions
across restarts, each batch in one transaction.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Callable


def cursor(conn: sqlite3.Connection) -> int | None:
    """The id of the newest shared alert already matched; None for a new store."""
    row = conn.execute("SELECT alert_id FROM cursor WHERE id = 1").fetchone()
    return None if row is None else int(row[0])


def start_cursor(conn: sqlite3.Connection, alert_id: int) -> None:
    conn.execute("INSERT INTO cursor (id, alert_id) VALUES (1, ?)", (alert_id,))


def queue(conn: sqlite3.Connection, matched: list[tuple[int, int, str]], cursor_to: int) -> None:
    """Queue each (alert id, subscription id, alert kind) as pending and move the cursor to
    cursor_to, together: an alert is matched once, never lost."""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT OR IGNORE INTO deliveries (alert_id, sub_id, kind) VALUES (?, ?, ?)", matched
        )
        conn.execute("UPDATE cursor SET alert_id = ? WHERE id = 1", (cursor_to,))


def due(conn: sqlite3.Connection, now: int, group_ms: int) -> dict[int, list[int]]:
    """{subscription id: its alert ids, oldest first} pending, due for a try, and whose
    subscription sent nothing in the last group_ms."""
    found: dict[int, list[int]] = {}
    for sub_id, alert_id in conn.execute(
        "SELECT d.sub_id, d.alert_id FROM deliveries d JOIN subscriptions s ON s.id = d.sub_id "
        "WHERE d.state = 'pending' AND d.next_try_ms <= ? AND s.last_sent_ms + ? <= ? "
        "ORDER BY d.sub_id, d.alert_id",
        (now, group_ms, now),
    ):
        found.setdefault(sub_id, []).append(alert_id)
    return found


def record_tries(
    conn: sqlite3.Connection,
    tries: list[tuple[int, list[int], str | None]],
    done_ms: int,
    retry_after_s: Callable[[int], float],
) -> None:
    """Each (subscription id, alert ids, error) tried at done_ms: sent when error is None, else
    due again retry_after_s(attempts so far) later, with the error kept."""
    with conn:
        conn.execute("BEGIN IMMEDIATE")
        for sub_id, alert_ids, error in tries:
            marks = ",".join("?" * len(alert_ids))
            if error is None:
                conn.execute(
                    f"UPDATE deliveries SET state = 'sent', sent_ms = ?, attempts = attempts + 1, "
                    f"last_error = NULL WHERE sub_id = ? AND alert_id IN ({marks})",
                    (done_ms, sub_id, *alert_ids),
                )
                conn.execute("UPDATE subscriptions SET last_sent_ms = ? WHERE id = ?", (done_ms, sub_id))
                continue
            for alert_id, attempts in conn.execute(
                f"SELECT alert_id, attempts FROM deliveries WHERE sub_id = ? AND alert_id IN ({marks})",
                (sub_id, *alert_ids),
            ).fetchall():
                conn.execute(
                    "UPDATE deliveries SET attempts = ?, next_try_ms = ?, last_error = ? "
                    "WHERE sub_id = ? AND alert_id = ?",
                    (
                        attempts + 1,
                        done_ms + int(retry_after_s(attempts + 1) * 1000),
                        error,
                        sub_id,
                        alert_id,
                    ),
                )


def prune_sent(conn: sqlite3.Connection, before_ms: int) -> None:
    """Forget deliveries sent before before_ms."""
    with conn:
        conn.execute("DELETE FROM deliveries WHERE state = 'sent' AND sent_ms < ?", (before_ms,))


def pending(conn: sqlite3.Connection, run_id: str | None = None) -> int:
    """Deliveries still waiting (for one run's `--notify` subscription, or all)."""
    if run_id is None:
        row = conn.execute("SELECT count(*) FROM deliveries WHERE state = 'pending'").fetchone()
    else:
        row = conn.execute(
            "SELECT count(*) FROM deliveries d JOIN subscriptions s ON s.id = d.sub_id "
            "WHERE d.state = 'pending' AND s.run_id = ?",
            (run_id,),
        ).fetchone()
    return int(row[0])


@dataclass(frozen=True)
class Delivery:
    alert_id: int
    sub_id: int
    url: str  # the secret: whoever shows it redacts it
    state: str
    attempts: int
    sent_ms: int | None


def of_alerts(conn: sqlite3.Connection, alert_ids: list[int], uid: int | None) -> list[Delivery]:
    """The deliveries of these alerts to `uid`'s subscriptions (None: everyone's), by
    subscription."""
    if not alert_ids:
        return []
    marks = ",".join("?" * len(alert_ids))
    sql = (
        f"SELECT d.alert_id, s.id, s.url, d.state, d.attempts, d.sent_ms FROM deliveries d "
        f"JOIN subscriptions s ON s.id = d.sub_id WHERE d.alert_id IN ({marks})"
    )
    args: list[int] = list(alert_ids)
    if uid is not None:
        sql += " AND s.uid = ?"
        args.append(uid)
    return [Delivery(*row) for row in conn.execute(sql + " ORDER BY s.id", args)]

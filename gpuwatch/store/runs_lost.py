"""A running run whose process died without a run_end: marked `lost`, or `killed` when the
kernel's OOM killer took it (the lost-run watch, gpuwatch/monitor/runs_watch.py, decides).

Both updates touch a run only while it is still `running`: a run_end that arrived meanwhile
wins."""

from __future__ import annotations

import sqlite3


def mark_lost(conn: sqlite3.Connection, run_id: str, ended_ms: int) -> None:
    """The run's process is gone; `ended_ms`: the last time it was known alive."""
    conn.execute(
        "UPDATE runs SET status = 'lost', ended_ms = ? WHERE run_id = ? AND status = 'running'",
        (ended_ms, run_id),
    )


def mark_oom_killed(conn: sqlite3.Connection, run_id: str, ended_ms: int, message: str) -> None:
    """The kernel's OOM killer killed the run's process (SIGKILL); `message` says so."""
    conn.execute(
        "UPDATE runs SET status = 'killed', signal = 9, error_type = 'OOMKilled', "
        "error_message = ?, ended_ms = ? WHERE run_id = ? AND status = 'running'",
        (message, ended_ms, run_id),
    )

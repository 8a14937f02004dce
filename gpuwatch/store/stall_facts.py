"""What the stalled-run watch reads of a run (gpuwatch/alerts/stalled_runs.py decides): its
newest step times, and which process steps it."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class StepTime:
    step_time_ms: float
    n_steps: int  # steps the row stands for: a folded row's step_time_ms is their mean


def newest_step_times(conn: sqlite3.Connection, run_id: str, limit: int) -> list[StepTime]:
    """The run's newest `limit` steps rows that have a step time, newest first."""
    return [
        StepTime(*row)
        for row in conn.execute(
            "SELECT step_time_ms, n_steps FROM steps WHERE run_id = ? AND step_time_ms IS NOT NULL "
            "ORDER BY step DESC LIMIT ?",
            (run_id, limit),
        )
    ]


def attached_pid(conn: sqlite3.Connection, run_id: str) -> int | None:
    """The pid in the run's newest 'attached' event: the child that `gpuwatch run` started and
    that calls step() (whether it still lives is the caller's to check)."""
    row = conn.execute(
        "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached' "
        "ORDER BY seq DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    if not row or not row[0]:
        return None
    try:
        payload = json.loads(row[0])
    except ValueError:
        return None
    pid = payload.get("pid") if isinstance(payload, dict) else None
    return pid if isinstance(pid, int) else None


def run_pid(conn: sqlite3.Connection, run_id: str) -> int | None:
    """The pid of the process that started the run (None if unknown, or no such run)."""
    row = conn.execute("SELECT pid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return row[0] if row else None

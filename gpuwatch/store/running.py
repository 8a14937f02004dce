"""The running runs: the one query the sampler, the lost-run and stalled-run watches, /metrics
and the alert rules share (each picks the fields it needs)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class RunningRun:
    run_id: str
    name: str | None
    uid: int
    user: str | None
    pid: int | None
    host: str | None
    job_id: str | None
    rank: int | None
    parent_run_id: str | None
    started_ms: int
    last_step_ms: int | None


_SQL = "SELECT {} FROM runs WHERE status = 'running'".format(", ".join(f.name for f in fields(RunningRun)))


def running_runs(conn: sqlite3.Connection, host: str | None = None) -> list[RunningRun]:
    """Every run whose status is running; with `host`, only those of that host or of no host
    (a run recorded before hosts were stored belongs to whoever reads it)."""
    if host is None:
        rows = conn.execute(_SQL).fetchall()
    else:
        rows = conn.execute(_SQL + " AND (host = ? OR host IS NULL)", (host,)).fetchall()
    return [RunningRun(*row) for row in rows]

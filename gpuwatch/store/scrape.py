"""What /metrics reads on each scrape besides the shared queries: a GPU's last XID, a running
run's newest step and the peak memory of its steps since the last scrape, and counts."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


def last_xids(conn: sqlite3.Connection) -> dict[int, int]:
    """{GPU index: the XID of its newest XID event}, for the GPUs that had one."""
    # SQLite takes the bare column `xid` from the row holding MAX(ts_ms).
    rows = conn.execute("SELECT gpu_index, xid, MAX(ts_ms) FROM xid_events GROUP BY gpu_index")
    return {index: xid for index, xid, _ in rows}


@dataclass(frozen=True)
class LastStep:
    step: int
    tokens_per_s: float | None


def last_step(conn: sqlite3.Connection, run_id: str) -> LastStep | None:
    """The run's highest step and its tokens/s; None before its first step."""
    row = conn.execute(
        "SELECT step, tokens_per_s FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1", (run_id,)
    ).fetchone()
    return None if row is None else LastStep(*row)


@dataclass(frozen=True)
class StepsAfter:
    """Of a run's steps after a given one: the highest step (None: there are none) and their
    peak CUDA memory (None: none reported it)."""

    last_step: int | None
    peak_bytes: int | None


def steps_after(conn: sqlite3.Connection, run_id: str, step: int) -> StepsAfter:
    """What a run's steps after `step` add, so a scrape reads only the steps new since the last."""
    row = conn.execute(
        "SELECT MAX(step), MAX(mem_peak_bytes) FROM steps WHERE run_id = ? AND step > ?", (run_id, step)
    ).fetchone()
    return StepsAfter(*row)


def runs_by_status(conn: sqlite3.Connection) -> dict[str, int]:
    """{status: how many runs have it}, for the statuses present."""
    return dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status"))


def alerts_by_kind(conn: sqlite3.Connection) -> dict[str, int]:
    """{kind: alerts written}, for the kinds present (the (kind, incident) index counts them)."""
    return dict(conn.execute("SELECT kind, count(*) FROM alerts GROUP BY kind"))

"""Which running runs are stalled: no step for max(stall_factor x median step time, stall_floor)
seconds while their process is alive.

The daemon's stall watch (gpuwatch/daemon/stalls.py) dumps their stacks; the alert rules
(gpuwatch/alerts) raise run.stalled from it where no daemon runs (the client may not import
gpuwatch.daemon, hence this module's place, as runs_watch.py's).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from dataclasses import dataclass

import psutil

from gpuwatch.base.config import Config
from gpuwatch.monitor.runs_watch import process_alive

MEDIAN_OF_STEPS = 101


@dataclass(frozen=True)
class Stalled:
    run_id: str
    pid: int
    last_step_ms: int
    silent_s: float
    threshold_s: float


def stepping_pid(conn: sqlite3.Connection, run_id: str) -> int | None:
    """The process that calls step(): the newest attached child under `gpuwatch run` if it is
    alive, else the process that started the run."""
    row = conn.execute(
        "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached' "
        "ORDER BY seq DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    if row and row[0]:
        pid = json.loads(row[0]).get("pid")
        if isinstance(pid, int) and psutil.pid_exists(pid):
            return pid
    row = conn.execute("SELECT pid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return row[0] if row else None


def stall_threshold_s(step_times_ms: list[float], cfg: Config) -> float:
    median_s = statistics.median(step_times_ms) / 1000.0 if step_times_ms else 0.0
    return max(cfg.stall_factor * median_s, cfg.stall_floor)


def find_stalled(conn: sqlite3.Connection, cfg: Config, host: str, now: int) -> list[Stalled]:
    """Running runs of this host silent for longer than their threshold, process alive."""
    found = []
    rows = conn.execute(
        "SELECT run_id, pid, started_ms, last_step_ms FROM runs WHERE status = 'running' "
        "AND host = ? AND last_step_ms IS NOT NULL AND last_step_ms < ?",
        (host, now - int(cfg.stall_floor * 1000)),
    ).fetchall()
    for run_id, pid, started_ms, last_step_ms in rows:
        # The last MEDIAN_OF_STEPS steps: a folded row counts as its n_steps steps of its mean.
        times: list[float] = []
        for t, n in conn.execute(
            "SELECT step_time_ms, n_steps FROM steps WHERE run_id = ? AND step_time_ms IS NOT NULL "
            "ORDER BY step DESC LIMIT ?",
            (run_id, MEDIAN_OF_STEPS),
        ):
            times += [t] * min(n, MEDIAN_OF_STEPS - len(times))
            if len(times) >= MEDIAN_OF_STEPS:
                break
        threshold = stall_threshold_s(times, cfg)
        silent = (now - last_step_ms) / 1000.0
        if silent <= threshold or pid is None or not process_alive(pid, started_ms):
            continue
        target = stepping_pid(conn, run_id)
        if target is not None:
            found.append(Stalled(run_id, target, last_step_ms, silent, threshold))
    return found

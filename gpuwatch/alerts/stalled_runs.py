"""Which running runs are stalled: no step for max(stall_factor x median step time, stall_floor)
seconds while their process is alive.

The alert rules raise run.stalled from it wherever the sampler runs (the daemon, or the
embedded client, which may not import gpuwatch.daemon, hence this module's place); the daemon's
stall watch (gpuwatch/daemon/stalls.py) dumps the stalled runs' stacks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from gpuwatch.base.config import Config
from gpuwatch.base.pids import process_alive
from gpuwatch.store import stall_facts
from gpuwatch.store.running import running_runs

if TYPE_CHECKING:
    import sqlite3

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
    pid = stall_facts.attached_pid(conn, run_id)
    if pid is not None and psutil.pid_exists(pid):
        return pid
    return stall_facts.run_pid(conn, run_id)


def stall_threshold_s(step_times_ms: list[float], cfg: Config) -> float:
    median_s = statistics.median(step_times_ms) / 1000.0 if step_times_ms else 0.0
    return max(cfg.stall_factor * median_s, cfg.stall_floor)


def find_stalled(conn: sqlite3.Connection, cfg: Config, host: str, now: int) -> list[Stalled]:
    """Running runs of this host silent for longer than their threshold, process alive."""
    found = []
    quiet_since = now - int(cfg.stall_floor * 1000)
    for run in running_runs(conn, host):
        if run.host != host or run.last_step_ms is None or run.last_step_ms >= quiet_since:
            continue
        # The last MEDIAN_OF_STEPS steps: a folded row counts as its n_steps steps of its mean.
        times: list[float] = []
        for row in stall_facts.newest_step_times(conn, run.run_id, MEDIAN_OF_STEPS):
            times += [row.step_time_ms] * min(row.n_steps, MEDIAN_OF_STEPS - len(times))
            if len(times) >= MEDIAN_OF_STEPS:
                break
        threshold = stall_threshold_s(times, cfg)
        silent = (now - run.last_step_ms) / 1000.0
        if silent <= threshold or run.pid is None or not process_alive(run.pid, run.started_ms):
            continue
        target = stepping_pid(conn, run.run_id)
        if target is not None:
            found.append(Stalled(run.run_id, target, run.last_step_ms, silent, threshold))
    return found

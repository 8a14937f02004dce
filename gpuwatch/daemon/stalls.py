"""Stall stacks: a running run that stopped stepping gets its Python stacks dumped, once.

A run is stalled when no step arrived for max(stall_factor x its median step time, stall_floor)
seconds while its process is alive. The py-spy dump runs in a worker thread (it takes a second
or more), never on the asyncio loop; the row goes through the writer like everything else.
One dump per stall episode: a run is dumped again only after it stepped again and re-stalled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sqlite3
import statistics
from dataclasses import dataclass

import psutil

from collectors import pyspy
from gpuwatch.config import Config
from gpuwatch.runs_watch import process_alive
from gpuwatch.store import Writer, now_ms

log = logging.getLogger(__name__)

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
    row = conn.execute("SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached' "
                       "ORDER BY seq DESC LIMIT 1", (run_id,)).fetchone()
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
        (host, now - int(cfg.stall_floor * 1000))).fetchall()
    for run_id, pid, started_ms, last_step_ms in rows:
        # The last MEDIAN_OF_STEPS steps: a folded row counts as its n_steps steps of its mean.
        times: list[float] = []
        for t, n in conn.execute(
                "SELECT step_time_ms, n_steps FROM steps WHERE run_id = ? AND step_time_ms IS NOT NULL "
                "ORDER BY step DESC LIMIT ?", (run_id, MEDIAN_OF_STEPS)):
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


def dump_row(run_id: str | None, pid: int, reason: str) -> dict:
    """Dump `pid`'s stacks now (blocking: call from a worker thread) as a stack_dumps row."""
    dump = pyspy.dump(pid, now_ms())
    return {"run_id": run_id, "pid": pid, "ts_ms": dump.ts_ms, "reason": reason,
            "stacks_json": None if dump.threads is None else json.dumps(dump.threads, separators=(",", ":")),
            "error": dump.error}


class StallWatch:
    """Checks every `interval` seconds on the running asyncio loop; dumps in worker threads."""

    def __init__(self, writer: Writer, cfg: Config, interval: float | None = None, host: str | None = None):
        self.writer = writer
        self.cfg = cfg
        self.interval = interval if interval is not None else min(max(cfg.stall_floor / 4, 0.2), 10.0)
        self.host = host or socket.gethostname()
        self.dumped: dict[str, int] = {}  # run_id -> last_step_ms of the episode already dumped
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            try:
                await self.check_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watcher must outlive a bad pass
                log.exception("stall watch: check failed")
            await asyncio.sleep(self.interval)

    async def check_once(self) -> list[str]:
        """One pass; returns the run ids dumped."""
        loop = asyncio.get_running_loop()
        found: asyncio.Future = loop.create_future()

        def job(conn):
            stalled = find_stalled(conn, self.cfg, self.host, now_ms())
            loop.call_soon_threadsafe(lambda: found.done() or found.set_result(stalled))

        if not self.writer.submit(job, lambda ok: ok or loop.call_soon_threadsafe(
                lambda: found.done() or found.set_result([])), block=False):
            return []
        stalled = await found
        # Forget runs that stepped again or ended: the map holds only current episodes.
        self.dumped = {s.run_id: self.dumped[s.run_id] for s in stalled if s.run_id in self.dumped}
        dumped = []
        for s in stalled:
            if self.dumped.get(s.run_id) == s.last_step_ms:
                continue  # this episode already has its dump
            self.dumped[s.run_id] = s.last_step_ms
            log.warning("run %s stalled: no step for %.0f s (threshold %.0f s); dumping pid %d",
                        s.run_id, s.silent_s, s.threshold_s, s.pid)
            row = await asyncio.to_thread(dump_row, s.run_id, s.pid, "stall")
            if not self.writer.insert("stack_dumps", [row], block=False):
                log.warning("stall watch: write queue full; stacks of run %s not stored", s.run_id)
            dumped.append(s.run_id)
        return dumped

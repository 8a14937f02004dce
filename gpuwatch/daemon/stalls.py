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
from typing import Callable

from collectors import pyspy
from gpuwatch.base.config import Config
from gpuwatch.monitor.stalled_runs import Stalled, find_stalled, stepping_pid  # noqa: F401 (stepping_pid: ingest's)
from gpuwatch.store import Writer, now_ms

log = logging.getLogger(__name__)


def dump_row(run_id: str | None, pid: int, reason: str) -> dict:
    """Dump `pid`'s stacks now (blocking: call from a worker thread) as a stack_dumps row."""
    dump = pyspy.dump(pid, now_ms())
    return {
        "run_id": run_id,
        "pid": pid,
        "ts_ms": dump.ts_ms,
        "reason": reason,
        "stacks_json": None if dump.threads is None else json.dumps(dump.threads, separators=(",", ":")),
        "error": dump.error,
    }


class StallWatch:
    """Checks every `interval` seconds on the running asyncio loop; dumps in worker threads."""

    def __init__(
        self,
        writer: Writer,
        cfg: Config,
        interval: float | None = None,
        host: str | None = None,
        on_stall: Callable[[Stalled, dict], object] | None = None,
    ):
        """`on_stall(stalled, stack_dumps row)`: called once per episode, after its dump (the
        alert rules raise run.stalled with its frames)."""
        self.writer = writer
        self.on_stall = on_stall
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

        if not self.writer.submit(
            job,
            lambda ok: ok or loop.call_soon_threadsafe(lambda: found.done() or found.set_result([])),
            block=False,
        ):
            return []
        stalled = await found
        # Forget runs that stepped again or ended: the map holds only current episodes.
        self.dumped = {s.run_id: self.dumped[s.run_id] for s in stalled if s.run_id in self.dumped}
        dumped = []
        for s in stalled:
            if self.dumped.get(s.run_id) == s.last_step_ms:
                continue  # this episode already has its dump
            self.dumped[s.run_id] = s.last_step_ms
            log.warning(
                "run %s stalled: no step for %.0f s (threshold %.0f s); dumping pid %d",
                s.run_id,
                s.silent_s,
                s.threshold_s,
                s.pid,
            )
            row = await asyncio.to_thread(dump_row, s.run_id, s.pid, "stall")
            if not self.writer.insert("stack_dumps", [row], block=False):
                log.warning("stall watch: write queue full; stacks of run %s not stored", s.run_id)
            if self.on_stall is not None:
                self.on_stall(s, row)
            dumped.append(s.run_id)
        return dumped

"""Stall stacks: a running run that stopped stepping gets its Python stacks dumped, once.

A run is stalled when no step arrived for max(stall_factor x its median step time, stall_floor)
seconds while its process is alive. The watch runs in a thread of its own (a py-spy dump takes
a second or more, never on the asyncio loop); the row goes through the writer like everything
else. One dump per stall episode: a run is dumped again only after it stepped again and
re-stalled.
"""

from __future__ import annotations

import json
import logging
import socket
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, Callable

from collectors import pyspy
from gpuwatch.alerts.stalled_runs import Stalled, find_stalled
from gpuwatch.alerts.stalled_runs import stepping_pid as stepping_pid  # for ingest and `gpuwatch stacks`
from gpuwatch.base.config import Config
from gpuwatch.monitor.periodic import Periodic
from gpuwatch.store import Writer, now_ms

if TYPE_CHECKING:
    import sqlite3

log = logging.getLogger(__name__)

ANSWER_WAIT_S = 60.0  # how long a check waits for the writer to run its query


def dump_row(run_id: str | None, pid: int, reason: str) -> dict[str, Any]:
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
    """Checks every `interval` seconds in a thread of its own, where it also dumps."""

    def __init__(
        self,
        writer: Writer,
        cfg: Config,
        interval: float | None = None,
        host: str | None = None,
        on_stall: Callable[[Stalled, dict[str, Any]], object] | None = None,
    ):
        """`on_stall(stalled, stack_dumps row)`: called once per episode, after its dump (the
        alert rules raise run.stalled with its frames)."""
        self.writer = writer
        self.on_stall = on_stall
        self.cfg = cfg
        self.interval = interval if interval is not None else min(max(cfg.stall_floor / 4, 0.2), 10.0)
        self.host = host or socket.gethostname()
        self.dumped: dict[str, int] = {}  # run_id -> last_step_ms of the episode already dumped
        self._periodic = Periodic("stall watch", self.interval, self.check_once)

    def start(self) -> None:
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()

    def _stalled(self) -> list[Stalled]:
        """The stalled runs, found in the writer's thread; none if the writer cannot say."""
        found: Future[list[Stalled]] = Future()

        def job(conn: sqlite3.Connection) -> None:
            found.set_result(find_stalled(conn, self.cfg, self.host, now_ms()))

        def written(ok: bool) -> None:
            if not found.done():  # the job failed, or its transaction did
                found.set_result([])

        if not self.writer.submit(job, written, block=False):
            return []
        try:
            return found.result(ANSWER_WAIT_S)
        except FutureTimeout:
            log.warning("stall watch: no answer from the database writer within %.0f s", ANSWER_WAIT_S)
            return []

    def check_once(self) -> list[str]:
        """One pass; returns the run ids dumped."""
        stalled = self._stalled()
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
            row = dump_row(s.run_id, s.pid, "stall")
            if not self.writer.insert("stack_dumps", [row], block=False):
                log.warning("stall watch: write queue full; stacks of run %s not stored", s.run_id)
            if self.on_stall is not None:
                self.on_stall(s, row)
            dumped.append(s.run_id)
        return dumped

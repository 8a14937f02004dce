"""Lost-run detection: a `running` run whose process is gone without a run_end becomes `lost`.

The daemon checks every few seconds; the client's embedded mode checks once when it opens the
per-user database (the client may not import gpuwatch.daemon, hence this module's place).

A run's process is gone when its pid no longer exists on this host, or exists but started
after the run did (the pid was reused by another process). ended_ms is the last time the run
was known alive: the last check that saw it, its last step, or its start. A process that the
kernel's OOM killer killed (its pid named in the kernel log) makes the run `killed` instead, with
an error message that says so and the run's last memory figures.
"""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING, Callable, NamedTuple

from collectors.kmsg import oom_killed
from gpuwatch.base.fmt import size
from gpuwatch.base.pids import process_alive
from gpuwatch.monitor.periodic import Periodic
from gpuwatch.store import Writer, now_ms, queries, runs_lost
from gpuwatch.store.running import running_runs

if TYPE_CHECKING:
    import sqlite3

log = logging.getLogger(__name__)


# A process's start time and the run's started_ms come from different clocks' roundings.
def _oom_killed_message(conn: sqlite3.Connection, run_id: str, kernel_line: str) -> str:
    """'killed by the kernel OOM killer' with its log line and the run's last memory sample."""
    memory = ""
    for last in queries.steps(conn, run_id, limit=1):
        memory = f"; at step {last.step}: RSS {size(last.rss_bytes)}, GPU allocated {size(last.mem_allocated_bytes)}"
    return f"killed by the kernel OOM killer (SIGKILL){memory}; kernel: {kernel_line}"[:2000]


class _Gone(NamedTuple):
    run_id: str
    pid: int
    ended_ms: int  # the last time the run was known alive


class RunsWatch:
    """Every `interval` seconds, mark runs of this host whose process died as lost."""

    def __init__(
        self,
        writer: Writer,
        interval: float = 5.0,
        alive: Callable[[int, int], bool] = process_alive,
        host: str | None = None,
        killed_by_oom: Callable[[set[int]], dict[int, str]] = oom_killed,
    ):
        self.writer = writer
        self.interval = interval
        self.alive = alive
        self.killed_by_oom = killed_by_oom
        self.host = host or socket.gethostname()
        self.last_alive_ms: dict[str, int] = {}  # touched only on the writer thread
        self._periodic = Periodic(
            "lost-run watch", interval, lambda: self.writer.submit(self.check, block=False)
        )

    def check(self, conn: sqlite3.Connection) -> list[str]:
        """One pass on the writer's connection; returns the run ids marked lost."""
        now = now_ms()
        lost, gone = [], []
        for run in running_runs(conn, self.host):
            if run.host != self.host or run.pid is None:  # only this host's processes can be looked at
                continue
            if self.alive(run.pid, run.started_ms):
                self.last_alive_ms[run.run_id] = now
                continue
            ended = max(self.last_alive_ms.pop(run.run_id, 0), run.last_step_ms or 0, run.started_ms)
            gone.append(_Gone(run.run_id, run.pid, ended))
        killed = self.killed_by_oom({g.pid for g in gone}) if gone else {}
        for g in gone:
            if g.pid in killed:
                runs_lost.mark_oom_killed(
                    conn, g.run_id, g.ended_ms, _oom_killed_message(conn, g.run_id, killed[g.pid])
                )
                log.warning("run %s: pid %d was killed by the kernel OOM killer", g.run_id, g.pid)
                continue
            runs_lost.mark_lost(conn, g.run_id, g.ended_ms)
            lost.append(g.run_id)
        if lost:
            log.warning("runs lost (process gone without run_end): %s", ", ".join(lost))
        return lost

    def start(self) -> None:
        """Check now, then every interval, in a thread of its own (each check runs in the
        writer's thread, on its connection)."""
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop()

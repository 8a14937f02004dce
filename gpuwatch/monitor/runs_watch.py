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

import asyncio
import logging
import socket
import sqlite3
from typing import Callable

import psutil

from collectors.kmsg import oom_killed
from gpuwatch.base.fmt import size
from gpuwatch.store import Writer, now_ms

log = logging.getLogger(__name__)

# A process's start time and the run's started_ms come from different clocks' roundings.
START_SLACK_MS = 2000


def process_alive(pid: int, started_ms: int) -> bool:
    """True if `pid` is still the process that started the run at `started_ms`."""
    try:
        created_ms = int(psutil.Process(pid).create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.Error:
        return True  # exists but unreadable (e.g. hidepid): not evidence that it is gone
    return created_ms <= started_ms + START_SLACK_MS


def _oom_killed_message(conn: sqlite3.Connection, run_id: str, kernel_line: str) -> str:
    """'killed by the kernel OOM killer' with its log line and the run's last memory sample."""
    last = conn.execute(
        "SELECT step, rss_bytes, mem_allocated_bytes FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    memory = ""
    if last is not None:
        memory = f"; at step {last[0]}: RSS {size(last[1])}, GPU allocated {size(last[2])}"
    return f"killed by the kernel OOM killer (SIGKILL){memory}; kernel: {kernel_line}"[:2000]


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
        self._task: asyncio.Task | None = None

    def check(self, conn: sqlite3.Connection) -> list[str]:
        """One pass on the writer's connection; returns the run ids marked lost."""
        now = now_ms()
        lost, gone = [], []
        rows = conn.execute(
            "SELECT run_id, pid, started_ms, last_step_ms FROM runs "
            "WHERE status = 'running' AND pid IS NOT NULL AND host = ?",
            (self.host,),
        ).fetchall()
        for run_id, pid, started_ms, last_step_ms in rows:
            if self.alive(pid, started_ms):
                self.last_alive_ms[run_id] = now
                continue
            gone.append((run_id, pid, max(self.last_alive_ms.pop(run_id, 0), last_step_ms or 0, started_ms)))
        killed = self.killed_by_oom({pid for _, pid, _ in gone}) if gone else {}
        for run_id, pid, ended in gone:
            if pid in killed:
                conn.execute(
                    "UPDATE runs SET status = 'killed', signal = 9, error_type = 'OOMKilled', "
                    "error_message = ?, ended_ms = ? WHERE run_id = ? AND status = 'running'",
                    (_oom_killed_message(conn, run_id, killed[pid]), ended, run_id),
                )
                log.warning("run %s: pid %d was killed by the kernel OOM killer", run_id, pid)
                continue
            conn.execute(
                "UPDATE runs SET status = 'lost', ended_ms = ? WHERE run_id = ? AND status = 'running'",
                (ended, run_id),
            )
            lost.append(run_id)
        if lost:
            log.warning("runs lost (process gone without run_end): %s", ", ".join(lost))
        return lost

    def start(self) -> None:
        """Start checking on the running asyncio loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            self.writer.submit(self.check, block=False)
            await asyncio.sleep(self.interval)

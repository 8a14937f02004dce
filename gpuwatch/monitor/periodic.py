"""One job run every N seconds in a thread of its own until stopped: the lost-run watch, the
stall watch and the adoption of orphaned spool files are each one of these.

It is a Scheduler (gpuwatch/monitor/scheduler.py) with a single job, so it keeps the
Scheduler's rules: the first run at start, deadlines on the monotonic clock without drift, a
run never overlapping the previous one (deadlines it overran are skipped), a failing run
logged and the next one going ahead, stop() waking the thread at once.
"""

from __future__ import annotations

from typing import Callable

from gpuwatch.monitor.scheduler import Job, Scheduler


class Periodic:
    def __init__(
        self,
        name: str,
        interval: float,
        job: Callable[[], object],
        setup: Callable[[], object] | None = None,
    ):
        """`name` says what the job does (in the thread's name and in a failure's log line);
        `setup` is called first in the thread (e.g. to lower its priority)."""
        self.name = name
        self.setup = setup
        self._scheduler = Scheduler()
        self.job: Job = self._scheduler.add(name, interval, job)

    def start(self) -> None:
        self._scheduler.start(f"gpuwatch-{self.name.replace(' ', '-')}", setup=self.setup)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop after the run in progress, if any; waits up to `timeout` s for it."""
        self._scheduler.stop(timeout)

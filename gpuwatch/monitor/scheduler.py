"""A small periodic scheduler on the monotonic clock, run in one thread.

Each job has its own interval. Its next deadline is the previous deadline plus the interval, so
ticks never drift however long a job takes. A job never overlaps itself: when a tick overran one
or more later deadlines, those are skipped (and counted in `Job.skipped`) instead of being run as
a burst. `stop()` wakes the thread at once (it sleeps on an Event, not time.sleep).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from gpuwatch.base import threads

log = logging.getLogger(__name__)


@dataclass
class Job:
    name: str
    interval: float  # seconds
    func: Callable[[], object]
    next_deadline: float = 0.0
    runs: int = 0
    skipped: int = 0  # deadlines missed because the previous run was still going
    errors: int = 0
    last_duration: float = 0.0  # seconds the last run took
    last_error: str = field(default="", repr=False)


class Scheduler:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wait: Callable[[float], bool] | None = None
    ):
        """`clock` gives seconds; `wait(timeout)` sleeps and returns True when asked to stop.

        Both are injectable so tests can run many ticks on a fake clock instantly.
        """
        self._clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self.jobs: list[Job] = []
        self._thread: threading.Thread | None = None

    def add(self, name: str, interval: float, func: Callable[[], object], first_delay: float = 0.0) -> Job:
        if interval <= 0:
            raise ValueError(f"{name}: interval must be > 0, got {interval}")
        job = Job(name, interval, func, next_deadline=self._clock() + first_delay)
        self.jobs.append(job)
        return job

    def run(self) -> None:
        """Run jobs until stop(); call from the thread that should do the work."""
        while not self._stop.is_set():
            job = min(self.jobs, key=lambda j: j.next_deadline)
            delay = job.next_deadline - self._clock()
            if delay > 0:
                if self._wait(delay) or self._stop.is_set():
                    return
                continue  # re-pick: the clock moved, another job may be due first
            self._run_job(job)

    def _run_job(self, job: Job) -> None:
        started = self._clock()
        try:
            job.func()
        except Exception as e:  # a failing collector must not stop the others
            job.errors += 1
            job.last_error = f"{type(e).__name__}: {e}"
            log.exception("scheduler: job %s failed", job.name)
        finished = self._clock()
        job.runs += 1
        job.last_duration = finished - started
        job.next_deadline += job.interval
        while job.next_deadline < finished:  # overran: skip what passed, never run a burst
            job.skipped += 1
            job.next_deadline += job.interval

    def start(self, name: str = "gpuwatch-scheduler", setup: Callable[[], object] | None = None) -> None:
        """Run the jobs in a thread of its own; `setup` is called first in that thread."""

        def thread() -> None:
            if setup is not None:
                setup()
            self.run()

        self._thread = threads.start(threading.Thread(target=thread, name=name, daemon=True))

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

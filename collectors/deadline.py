"""Calls that may block for good (a hung GPU's NVML calls), run in worker threads whose every
call is timed from its own start, so that a call that blocked is told from a process that was
merely busy.

One Worker per thing that can hang (each GPU, NVML's system-wide calls). `gather` hands a round
of jobs to several workers at once and wakes its caller once, when the last one is done (one
Event a round, not a Future per job). A worker is called hung only when the call it is in (its
`call_since`) has run past the deadline, measured from that call's start, AND stays in flight
while the caller's own short sleeps add up to a quiet window of on-time wake-ups (added up over
rounds): a process whose GIL or CPUs were taken by other work (a spool replay, an ingest flood)
delays the caller's wake-ups too, so it never turns into a false "hung"; a busy process makes
such a call LATE for that round instead. A worker still in a call is not handed another job:
blocked threads never outnumber the workers. Threads are daemon threads: a call that never
returns cannot hold up exit.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future, TimeoutError
from typing import Callable, TypeVar

T = TypeVar("T")

__all__ = ["Worker", "TimeoutError", "call_with_deadline", "gather", "running_worker", "HUNG", "LATE"]

HUNG = "hung"  # gather's answer for a worker whose call blocked past the deadline
LATE = "late"  # no answer within the round, but no call of its shown to block (a busy process)
QUIET_STEP_S = 0.005  # the caller's sleeps in the quiet window...
QUIET_SLACK_S = 0.010  # ...one that wakes later than this (the process was busy) does not count
QUIET_MAX_S = 0.05  # the window of on-time sleeps: this long, or the deadline if shorter
QUIET_GIVE_UP = 4  # a window not found quiet within this many windows: the process is busy

_thread = threading.local()


def running_worker() -> Worker | None:
    """The Worker whose thread this is (None outside any): the one a call that may block is
    timed on."""
    return getattr(_thread, "worker", None)


class Worker:
    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = False  # a job was handed over and has not returned yet
        self._thread: threading.Thread | None = None
        # Monotonic start of the call it is in, set by the code it runs around each call that
        # may block (NvmlCollector._call); None between calls.
        self.call_since: float | None = None
        # What it works on, set by the code it runs (a worker that reads several GPUs one after
        # another names the one it is reading): whose call it is when one is found blocked.
        self.current: object = None
        self._outcome: tuple[bool, object] = (True, None)  # (ok, result or exception)
        # (call_since of the call in flight, seconds of quiet seen while it was): gather's
        # evidence that the call blocked, kept across rounds.
        self.quiet: tuple[float | None, float] = (None, 0.0)

    @property
    def busy(self) -> bool:
        return self._busy

    def in_call_s(self, now: float) -> float:
        """How long its current call has been in flight (0 between calls)."""
        since = self.call_since
        return 0.0 if since is None else now - since

    def start(self, fn: Callable[[], object], done: Callable[[], None]) -> None:
        """Run fn in the worker, then call done(); the caller must check `busy` first."""
        if self._busy:
            raise RuntimeError(f"{self.name}: still busy with an earlier call")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._busy = True
        self._jobs.put((fn, done))

    def outcome(self):
        """The result of the job that finished last (raises what it raised)."""
        ok, value = self._outcome
        if not ok:
            raise value  # type: ignore[misc]
        return value

    def submit(self, fn: Callable[[], T]) -> Future:
        """Run fn in the worker; its Future (for one-off calls, not the sampling rounds)."""
        future: Future = Future()

        def done() -> None:
            ok, value = self._outcome
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)  # type: ignore[arg-type]

        self.start(fn, done)
        return future

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """fn's result, or TimeoutError when it took longer than `timeout` (it runs on)."""
        return self.submit(fn).result(timeout)

    def close(self) -> None:
        """Let the thread end once its current call (if any) returns."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _run(self) -> None:
        _thread.worker = self
        while True:
            item = self._jobs.get()
            if item is None:
                return
            fn, done = item
            try:
                self._outcome = (True, fn())
            except BaseException as e:  # handed to the caller, who decides
                self._outcome = (False, e)
            self._busy = False  # free before the caller wakes, so it can hand over the next
            done()


class _Countdown:
    """Set once every worker of a round is done: the caller wakes once, not once per worker."""

    def __init__(self, n: int):
        self._left = n
        self._lock = threading.Lock()
        self.all_done = threading.Event()
        if n == 0:
            self.all_done.set()

    def arrive(self) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.all_done.set()


def gather(
    jobs: list[tuple[Worker, Callable[[], object] | None]], deadline_s: float, max_wait_s: float
) -> dict[Worker, object]:
    """Run each job in its worker side by side; {worker: its result, HUNG or LATE}.

    A job of None watches a worker still busy with an earlier round's job: HUNG if the call it
    is in blocks, else LATE (whatever it returns belongs to an earlier round; it is not waited
    for). The caller waits until every job is done, or a worker's call is found blocked (HUNG,
    see the module's docstring), or max_wait_s passed (LATE: not answering yet, not shown to
    block). A job's exception is raised here.
    """
    asked = [w for w, fn in jobs if fn is not None]
    watched = [w for w, fn in jobs if fn is None]
    countdown = _Countdown(len(asked))
    for worker, fn in jobs:
        if fn is not None:
            worker.start(fn, countdown.arrive)
    give_up = time.monotonic() + max_wait_s
    hung: set[Worker] = set()
    while True:
        now = time.monotonic()
        waiting = [w for w in asked if w.busy and w not in hung]
        blocked = [w for w in waiting + watched if w not in hung and w.in_call_s(now) > deadline_s]
        if blocked:
            found = _still_blocked(blocked, deadline_s)
            if found is None or (not found and now >= give_up):
                break  # busy: whoever has not answered is LATE this round, not waited for on
            hung.update(found)
            continue
        if not waiting or now >= give_up:
            break
        # Sleep until the first call in flight could pass its deadline (a short poll while a
        # worker has not begun one), never past give_up.
        starts = [w.call_since for w in waiting]
        first = min((s for s in starts if s is not None), default=None)
        wake = first + deadline_s if None not in starts and first is not None else now + QUIET_MAX_S
        countdown.all_done.wait(max(0.001, min(wake, give_up) - now))
    answers: dict[Worker, object] = {}
    for worker, fn in jobs:
        if worker in hung:
            answers[worker] = HUNG
        elif fn is None or worker.busy:
            answers[worker] = LATE
        else:
            answers[worker] = worker.outcome()
    return answers


def _still_blocked(blocked: list[Worker], deadline_s: float) -> list[Worker] | None:
    """Those of `blocked` whose same call is still in flight once our own short sleeps have
    woken on time for a window's worth while it was (the ones that woke late do not count):
    time in which the GIL and a CPU were there for their threads too. That evidence adds up
    over rounds, so a process busy in long stretches with short pauses still finds a blocked
    call. None if no worker's window filled this round (the process is busy)."""
    window = min(QUIET_MAX_S, deadline_s)
    for w in blocked:
        if w.quiet[0] != w.call_since:  # a new call: no evidence yet
            w.quiet = (w.call_since, 0.0)
    give_up = time.monotonic() + QUIET_GIVE_UP * window
    while True:
        live = [w for w in blocked if w.busy and w.call_since == w.quiet[0]]
        if not live:
            return []
        full = [w for w in live if w.quiet[1] >= window]
        if full:
            return full
        asked_at = time.monotonic()
        if asked_at >= give_up:
            return None
        time.sleep(QUIET_STEP_S)
        slept = time.monotonic() - asked_at
        if slept <= QUIET_STEP_S + QUIET_SLACK_S:  # woke on time: the process was free
            for w in live:
                w.quiet = (w.quiet[0], w.quiet[1] + slept)


def call_with_deadline(fn: Callable[[], T], timeout: float, name: str = "gpuwatch-deadline") -> T:
    """One call in a thread of its own; TimeoutError after `timeout` s (the thread is left)."""
    worker = Worker(name)
    try:
        return worker.call(fn, timeout)
    finally:
        worker.close()

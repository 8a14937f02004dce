"""Calls that may block for good (a hung GPU's NVML calls), run in a worker thread that is
waited for only until a deadline.

One Worker per thing that can hang (each GPU, NVML's system-wide calls). A call still blocked
when the next is due is not queued behind it: the caller sees `busy` and skips that thing, so
blocked threads never outnumber the workers, and the caller's own thread never blocks longer
than its deadline. Threads are daemon threads: a call that never returns cannot hold up exit.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, TimeoutError
from typing import Callable, TypeVar

T = TypeVar("T")

__all__ = ["Worker", "TimeoutError", "call_with_deadline"]


class Worker:
    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._busy = False  # a job was handed over and has not returned yet
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, fn: Callable[[], T]) -> Future:
        """Run fn in the worker; the caller must check `busy` first (a busy worker is hung)."""
        if self._busy:
            raise RuntimeError(f"{self.name}: still busy with an earlier call")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        future: Future = Future()
        self._busy = True
        self._jobs.put((fn, future))
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
        while True:
            item = self._jobs.get()
            if item is None:
                return
            fn, future = item
            try:
                result = fn()
            except BaseException as e:  # handed to the caller, who decides
                self._busy = False  # free before the caller wakes, so it can submit again
                future.set_exception(e)
            else:
                self._busy = False
                future.set_result(result)


def call_with_deadline(fn: Callable[[], T], timeout: float, name: str = "gpuwatch-deadline") -> T:
    """One call in a thread of its own; TimeoutError after `timeout` s (the thread is left)."""
    worker = Worker(name)
    try:
        return worker.call(fn, timeout)
    finally:
        worker.close()

"""Cheap per-step figures: step clocks, allocator / RSS memory, losses resolved without a sync.

Nothing here imports torch: the CUDA variants are made only when the workload already
initialised CUDA, and receive the torch module from `cuda_torch()`.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType
from typing import Any, Sequence

# A CUDA event pair: (previous step's end or None on the first step, this step's end).
EventPair = tuple[Any, Any]


def cuda_torch() -> ModuleType | None:
    """The torch module if the workload imported it and initialised CUDA, else None."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch
    return None


class CpuClock:
    """Step time = wall time between step() calls; on CPU the work is done when step() is called."""

    def __init__(self, since: float | None = None) -> None:
        self._last = time.perf_counter() if since is None else since

    def mark(self, now: float | None = None) -> float:
        """Ms since the previous mark; `now`: a time.perf_counter() reading already taken."""
        if now is None:
            now = time.perf_counter()
        elapsed_ms = (now - self._last) * 1000.0
        self._last = now
        return elapsed_ms

    def compute_mark(self) -> float:
        """Ms since the last step ended: the wait before this iteration's compute began."""
        return (time.perf_counter() - self._last) * 1000.0

    @staticmethod
    def ready(mark: float, wait: bool = False) -> bool:
        return True

    @staticmethod
    def elapsed_ms(mark: float) -> float:
        return mark

    @staticmethod
    def wait_pct(mark: float, compute: float, step_ms: float | None) -> float | None:
        return _share_pct(compute, step_ms)


class CudaClock:
    """Step time = GPU time between CUDA events recorded at consecutive step() calls.

    Recording an event does not wait for the GPU; the elapsed time is read later, once
    event.query() says the GPU got there, so the training loop never gains a synchronize.
    """

    def __init__(self, torch: ModuleType, start_event: Any = None) -> None:
        self._torch = torch
        self._last = start_event

    @staticmethod
    def start_event(torch: ModuleType) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self) -> EventPair:
        event = self.start_event(self._torch)
        pair = (self._last, event)
        self._last = event
        return pair

    def compute_mark(self) -> Any:
        """An event where this iteration's compute begins: the GPU reaches it once it finished the
        last step and the host queued the new batch, so the gap is time the GPU waited for data."""
        return self.start_event(self._torch)

    @staticmethod
    def ready(mark: EventPair, wait: bool = False) -> bool:
        if wait:
            mark[1].synchronize()
            return True
        done: bool = mark[1].query()  # annotated, not bool(): this runs for every step
        return done

    @staticmethod
    def elapsed_ms(mark: EventPair) -> float | None:
        start, end = mark
        return None if start is None else start.elapsed_time(end)  # first step: no start event

    @staticmethod
    def wait_pct(mark: EventPair, compute: Any, step_ms: float | None) -> float | None:
        start = mark[0]
        if start is None or not compute.query():  # recorded on another stream, not reached yet
            return None
        return _share_pct(start.elapsed_time(compute), step_ms)


def _share_pct(wait_ms: float, step_ms: float | None) -> float | None:
    """The data wait as a share of the step, 0..100 (clock jitter can put it a hair outside)."""
    if not step_ms or step_ms <= 0:
        return None
    return min(100.0, max(0.0, 100.0 * wait_ms / step_ms))


def capture_loss(loss: Any) -> Any:
    """Keep a loss without reading it now: a CUDA tensor starts an async copy to host memory.

    The copy is queued before the step's CUDA event, so once that event completed the host copy
    holds the value and `.item()` no longer waits for the GPU.
    """
    if loss is None or isinstance(loss, (int, float)):
        return loss
    is_cpu = getattr(loss, "is_cpu", None)
    if is_cpu is None:  # not a tensor (a numpy scalar)
        return float(loss)
    if is_cpu:
        # Read now: on gpuwatch's drainer thread it would hand the GIL to the training thread and
        # wait to get it back, which costs more than this.
        return loss.item()
    if loss.is_cuda:
        return loss.detach().to("cpu", non_blocking=True)
    return loss.detach()


def resolve_losses(captured: Sequence[Any]) -> list[float | None]:
    """Losses capture_loss kept, read; the tensors among them (CUDA losses' host copies) in one
    tensor op: each torch op of the drainer thread hands the GIL to the training thread and
    waits to get it back."""
    values: list[float | None] = []
    tensors, where = [], []
    for i, one in enumerate(captured):
        if hasattr(one, "item"):
            tensors.append(one)
            where.append(i)
            values.append(None)
        else:
            values.append(None if one is None else float(one))
    if len(tensors) > 1:
        try:
            read = sys.modules["torch"].stack(tensors).tolist()  # (a tensor exists: torch is imported)
        except (KeyError, RuntimeError, TypeError):  # what stack cannot join: one at a time
            read = [t.item() for t in tensors]
    else:
        read = [t.item() for t in tensors]
    for i, value in zip(where, read):
        values[i] = float(value)
    return values


def resolve_counts(captured: Sequence[Any]) -> list[int | None]:
    """Counts captured as losses are (tensors summed on the GPU, or numbers), read as ints."""
    return [None if value is None else round(value) for value in resolve_losses(captured)]


class RssReader:
    """Resident set size of this process from /proc/self/statm: one pread, at most once per
    `every_s` (a /proc read costs tens of µs in a sandbox's kernel; steps can be milliseconds)."""

    def __init__(self, every_s: float = 0.25) -> None:
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._every_s = every_s
        self._read_at = -every_s
        self._last: int | None = None
        try:
            self._fd: int | None = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # not Linux
            self._fd = None

    def read(self) -> int | None:
        now = time.monotonic()
        if now - self._read_at < self._every_s or self._fd is None:
            return self._last
        self._read_at = now
        try:
            self._last = int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            self._last = None
        return self._last

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def cuda_memory(torch: ModuleType) -> tuple[int, int, int]:
    """(allocated, reserved, peak allocated) bytes of the current device: host-side counters, no sync."""
    cuda = torch.cuda
    return cuda.memory_allocated(), cuda.memory_reserved(), cuda.max_memory_allocated()


def memory_stats_fields(stats: dict[str, Any]) -> dict[str, Any]:
    """Columns of `memory_stats` from torch.cuda.memory_stats(); keys vary by version, so .get()."""
    return {
        "num_alloc_retries": stats.get("num_alloc_retries"),
        "num_ooms": stats.get("num_ooms"),
        "inactive_split_bytes": stats.get("inactive_split_bytes.all.current"),
        "stats": stats,
    }

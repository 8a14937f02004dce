"""The two clocks, and what each is for.

Wall time (`now_ms()`, ms since the epoch) stamps what users read and what orders events: every
`ts_ms`, a run's start and end. Monotonic time measures durations, rates and schedules: step
times and tokens/s (the client), the sampler's cadence (scheduler.py), how long data has been
kept. The wall clock steps (an NTP correction, a VM resumed after a pause); the monotonic one
does not. The wall clock is read through `now_ms()` here (its source,
`wall_clock_ns`, is the one thing a test replaces to step it for every reader at once); code
that needs both clocks on its own timeline takes them as arguments (the Sampler's `clock` and
`monotonic`, StoreSource's `clock`), so tests step the wall clock back an hour or forward a day
while monotonic time moves on.
"""

from __future__ import annotations

import time
from typing import Callable

# The wall clock, which every now_ms() reads: tests replace it to step time back and forth.
wall_clock_ns: Callable[[], int] = time.time_ns


def now_ms() -> int:
    return wall_clock_ns() // 1_000_000


# Wall and monotonic time may drift apart this much without counting as a step.
STEP_TOLERANCE_MS = 2_000


class SteadyWall:
    """Wall time that never runs ahead of the monotonic time that really passed: retention
    measures the age of data with it. After a step forward it advances only as monotonic time
    does, so the samples from before the step are kept their whole window; after a step back it
    follows the wall clock (data then looks younger and is kept longer, never shorter)."""

    def __init__(
        self, wall_ms: Callable[[], int] = now_ms, monotonic_s: Callable[[], float] = time.monotonic
    ):
        self._wall_ms, self._monotonic_s = wall_ms, monotonic_s
        self._anchor: tuple[int, float] | None = None  # (steady ms, monotonic s) at the last read

    def __call__(self) -> int:
        wall, mono = self._wall_ms(), self._monotonic_s()
        if self._anchor is not None:
            steady = self._anchor[0] + round((mono - self._anchor[1]) * 1000)
            if wall > steady + STEP_TOLERANCE_MS:
                wall = steady  # stepped forward: only what really passed counts
        self._anchor = (wall, mono)
        return wall


def elapsed_end_ms(started_ms: int, started_mono_s: float, wall_ms: int, mono_s: float) -> int:
    """When something that started at started_ms (wall) ended: the wall clock now, unless it
    stepped since the start; then the start plus the monotonic time that passed, so the end
    minus the start is how long it really took, never negative nor a day too long."""
    ran = started_ms + round((mono_s - started_mono_s) * 1000)
    return wall_ms if abs(wall_ms - ran) <= STEP_TOLERANCE_MS else ran


def run_duration_ms(started_ms: int, ended_ms: int | None, now_ms: int) -> int:
    """How long a run ran, or has run so far. Its end is timed from its start on the monotonic
    clock (elapsed_end_ms); a running run's start can still be ahead of a wall clock that
    stepped back since, which is no time at all, not a negative one."""
    return max(0, (now_ms if ended_ms is None else ended_ms) - started_ms)

"""GPU utilisation sparklines kept between polls: each poll reads only the samples of the
newest slots instead of five minutes of every GPU (8 series queries a second, before)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuwatch.store.queries import util_by_slot

if TYPE_CHECKING:
    import sqlite3

SPARK_WINDOW_MS = 5 * 60_000  # GPU util sparklines cover the last five minutes
SPARK_POINTS = 60
SPARK_SLOT_MS = SPARK_WINDOW_MS // SPARK_POINTS
REREAD_SLOTS = 2  # the newest slots may still fill (or get a late tick): read them again


def window_start(now_ms: int) -> int:
    """Slots aligned to the clock, not to "now": a slot's average changes only when a sample
    lands in it, so an idle GPU's sparkline (and the terminal) stays still between slots."""
    return (now_ms // SPARK_SLOT_MS + 1) * SPARK_SLOT_MS - SPARK_WINDOW_MS


class SparkHistory:
    def __init__(self) -> None:
        self.averages: dict[int, dict[int, float]] = {}  # gpu_index -> slot start -> average
        self.read_from_ms: int | None = None

    def update(
        self, conn: sqlite3.Connection, gpu_indexes: list[int], now_ms: int
    ) -> dict[int, tuple[float | None, ...]]:
        """Per GPU, the average utilisation of each slot of the window ending at `now_ms`,
        oldest first; None where nothing was sampled (a gap shows as a gap)."""
        start = window_start(now_ms)
        if self.read_from_ms is not None and self.read_from_ms > now_ms:
            # The wall clock stepped back: what was read is from its future, read the window afresh.
            self.averages, self.read_from_ms = {}, None
        since = start if self.read_from_ms is None else max(start, self.read_from_ms)
        newest = None
        for s in util_by_slot(conn, gpu_indexes, since, start + SPARK_WINDOW_MS, SPARK_SLOT_MS):
            self.averages.setdefault(s.gpu_index, {})[s.slot_ms] = s.util_pct
            newest = s.newest_ms if newest is None else max(newest, s.newest_ms)
        if newest is not None:
            self.read_from_ms = (newest // SPARK_SLOT_MS - REREAD_SLOTS + 1) * SPARK_SLOT_MS
        elif self.read_from_ms is None:
            self.read_from_ms = start  # nothing yet: don't read the whole window again next poll
        for slots in self.averages.values():
            for old in [s for s in slots if s < start]:
                del slots[old]
        return {
            g: tuple(self.averages.get(g, {}).get(start + k * SPARK_SLOT_MS) for k in range(SPARK_POINTS))
            for g in gpu_indexes
        }

"""A run's phases from its own steps: warm-up, steady, slow, pauses, profiler windows.

Step times are normalised per token (per step when the run records no tokens), so a longer
sequence is not a slowdown. The steps are summed in SQL per bin of consecutive steps (at most
MAX_BINS bins, each at least MIN_BIN_MS long: a million-step run costs one pass over its rows), pauses between steps (evaluation, checkpoints: one
step far longer than the typical one) are set apart, and a change-point search cuts the per-bin series
where its level changes (binary segmentation). A phase must span MIN_BINS bins, so one noisy bin is not a phase.
"""

from __future__ import annotations

import math
import sqlite3
import statistics
from dataclasses import dataclass, replace

from gpuwatch.analysis.why.model import MIN_SLOW_MS, SLOW_PCT, Phase

MAX_BINS = 8_640  # a day of steps in 10 s bins; 1 s bins up to 2.4 h
MIN_BIN_MS = 1_000  # of typical steps
MIN_BINS = 2
# A step that takes PAUSE_FACTOR times the typical step (per token) and PAUSE_MIN_MS or more is
# a pause in the training loop (evaluation, a checkpoint), not a slow step.
PAUSE_FACTOR = 5.0
PAUSE_MIN_MS = 1_000
# Warm-up: slow first phases ending within this share of the run's steps.
WARMUP_MAX_SHARE = 0.2
SAMPLE_ROWS = 2_000  # rows read at each of 5 places to learn the typical step


@dataclass(frozen=True)
class Bin:
    """Sums over consecutive steps."""

    first_step: int
    last_step: int
    start_ms: int  # the first step's end (ts_ms) ...
    end_ms: int  # ... to the last one's
    steps: int  # steps it stands for (folded rows count n_steps)
    busy_ms: float  # step time outside pauses
    units: float  # tokens (or steps) outside pauses
    wait_ms: float  # busy time spent waiting for data (data_wait_pct)
    pauses: int = 0
    pause_ms: float = 0.0


def totals(bins: list[Bin], start_ms: int, end_ms: int) -> tuple[float, float, float, int] | None:
    """(busy ms, units, wait ms, steps) of the bins overlapping [start_ms, end_ms]; None if no units."""
    sel = [b for b in bins if b.end_ms >= start_ms and b.start_ms <= end_ms]
    units = sum(b.units for b in sel)
    if units <= 0:
        return None
    return sum(b.busy_ms for b in sel), units, sum(b.wait_ms for b in sel), sum(b.steps for b in sel)


@dataclass(frozen=True)
class Timeline:
    unit: str  # token | step
    baseline: float | None  # steady ms per unit
    phases: tuple[Phase, ...]
    bins: list[Bin]
    pauses: int
    pause_ms: int
    pause_phases: tuple[Phase, ...] = ()


def _typical(conn: sqlite3.Connection, run_id: str, lo: int, hi: int) -> tuple[str, float | None, float]:
    """(unit, typical ms per unit, typical ms per row) from a few thousand rows at five places."""
    rows = []
    for frac in (0.1, 0.3, 0.5, 0.7, 0.9):
        rows += conn.execute(
            "SELECT step_time_ms * n_steps, tokens FROM steps WHERE run_id = ? AND step >= ? "
            "AND step_time_ms IS NOT NULL ORDER BY step LIMIT ?",
            (run_id, lo + int((hi - lo) * frac), SAMPLE_ROWS // 5),
        ).fetchall()
    with_tokens = [(busy, tok) for busy, tok in rows if tok]
    unit = "token" if rows and len(with_tokens) * 2 >= len(rows) else "step"
    ratios = (
        sorted(busy / tok for busy, tok in with_tokens)
        if unit == "token"
        else sorted(busy for busy, _ in rows)
    )
    per_row = sorted(busy for busy, _ in rows)
    return (
        unit,
        (ratios[len(ratios) // 2] if ratios else None),
        (per_row[len(per_row) // 2] if per_row else 0.0),
    )


def read_bins(conn: sqlite3.Connection, run_id: str) -> tuple[str, list[Bin]]:
    """The run's steps summed per bin of consecutive steps, pauses set apart. A bin holds at
    least MIN_BIN_MS of typical steps, and there are at most MAX_BINS: one aggregate per bin,
    each a range of the primary key (2x faster than one GROUP BY, which sorts every row). Only
    the few bins whose slowest row looks like a pause are read again, row by row."""
    lo, hi = conn.execute("SELECT min(step), max(step) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
    if lo is None:
        return "step", []
    unit, typical, row_ms = _typical(conn, run_id, lo, hi)
    if typical is None:
        return unit, []
    per_bin = max(-(-(hi - lo + 1) // MAX_BINS), int(MIN_BIN_MS // max(row_ms, 1e-3)), 1)
    units = "tokens" if unit == "token" else "n_steps"
    query = (
        f"SELECT min(step), max(step), min(ts_ms), max(ts_ms), sum(n_steps), total(step_time_ms * n_steps), "
        f"total({units}), total(step_time_ms * n_steps * data_wait_pct) / 100.0, "
        f"max(step_time_ms * n_steps - ? * {units}) "
        f"FROM steps WHERE run_id = ? AND step BETWEEN ? AND ? AND step_time_ms IS NOT NULL AND {units} > 0"
    )
    pause_at = PAUSE_FACTOR * typical
    bins = []
    for first in range(lo, hi + 1, per_bin):
        row = conn.execute(query, (pause_at, run_id, first, first + per_bin - 1)).fetchone()
        if row[0] is None:
            continue
        b = Bin(*row[:8])
        if row[8] > 0:
            b = _without_pauses(conn, run_id, b, lo, units, pause_at)
        bins.append(b)
    return unit, bins


def _without_pauses(
    conn: sqlite3.Connection, run_id: str, b: Bin, first_step: int, units: str, pause_at: float
) -> Bin:
    """The bin with its pauses set apart: rows over PAUSE_FACTOR typical steps' time for their
    units and PAUSE_MIN_MS. The run's first row (set-up, compilation) is warm-up, never a pause."""
    rows = conn.execute(
        f"SELECT step_time_ms * n_steps, {units}, coalesce(data_wait_pct, 0) / 100.0 FROM steps "
        f"WHERE run_id = ? AND step BETWEEN ? AND ? AND step > ? AND step_time_ms * n_steps > max(?, ? * {units})",
        (run_id, b.first_step, b.last_step, first_step, PAUSE_MIN_MS, pause_at),
    ).fetchall()
    busy = sum(r[0] for r in rows)
    return replace(
        b,
        busy_ms=b.busy_ms - busy,
        units=b.units - sum(r[1] for r in rows),
        wait_ms=b.wait_ms - sum(r[0] * r[2] for r in rows),
        pauses=len(rows),
        pause_ms=busy,
    )


def _segments(level: list[float]) -> list[tuple[int, int]]:
    """[start, end) bin ranges of constant level, by binary segmentation of log(level) with a
    squared-error cost (a change of mean), penalised by the series' own noise so that noise is no
    phase. Plain Python over prefix sums: a day's 8,640 bins take milliseconds. (ruptures does
    the same, but importing it pulls in scipy.stats: 1.2-1.6 s, more than the whole analysis.)"""
    signal = [math.log(v) for v in level]
    n = len(signal)
    diffs = [abs(b - a) for a, b in zip(signal, signal[1:])]
    sigma = max(1.4826 * statistics.median(diffs) / math.sqrt(2), 0.02) if diffs else 0.02
    penalty = 4 * sigma**2 * math.log(max(n, 2)) + 0.02
    csum, csq = [0.0], [0.0]
    for v in signal:
        csum.append(csum[-1] + v)
        csq.append(csq[-1] + v * v)

    def sse(i: int, j: int) -> float:  # squared error around the mean of [i, j)
        s = csum[j] - csum[i]
        return csq[j] - csq[i] - s * s / (j - i)

    cuts, todo = [], [(0, n)]
    while todo:
        i, j = todo.pop()
        if j - i < 2 * MIN_BINS:
            continue
        whole = sse(i, j)
        gain, k = max((whole - sse(i, k) - sse(k, j), k) for k in range(i + MIN_BINS, j - MIN_BINS + 1))
        if gain > penalty:
            cuts.append(k)
            todo += [(i, k), (k, j)]
    bounds = [0, *sorted(cuts), n]
    return list(zip(bounds[:-1], bounds[1:]))


def _level(bins: list[Bin]) -> float:
    return sum(b.busy_ms for b in bins) / sum(b.units for b in bins)


def _phase(kind: str, bins: list[Bin], baseline: float) -> Phase:
    level = _level(bins)
    return Phase(
        kind,
        bins[0].start_ms,
        bins[-1].end_ms,
        bins[0].first_step,
        bins[-1].last_step,
        sum(b.steps for b in bins),
        level,
        (level / baseline - 1) * 100,
    )


def _baseline(bins: list[Bin], segs: list[tuple[int, int]]) -> float:
    """The run's steady ms per unit: the fastest segment lasting at least a fifth of the time
    (a run slow most of the time is still measured against its normal speed), else the median bin."""
    span = (bins[-1].end_ms - bins[0].start_ms) or 1
    long = [_level(bins[i:j]) for i, j in segs if bins[j - 1].end_ms - bins[i].start_ms >= span / 5]
    return min(long) if long else statistics.median(b.busy_ms / b.units for b in bins)


def timeline(conn: sqlite3.Connection, run_id: str) -> Timeline:
    """Cut a run's steps into phases; slow phases are those at least SLOW_PCT slower per unit
    than the steady speed for at least MIN_SLOW_MS."""
    unit, all_bins = read_bins(conn, run_id)
    paused = tuple(
        Phase("pause", b.start_ms, b.end_ms, b.first_step, b.last_step, b.pauses, None)
        for b in all_bins
        if b.pauses
    )
    pauses, pause_ms = sum(b.pauses for b in all_bins), int(sum(b.pause_ms for b in all_bins))
    bins = [b for b in all_bins if b.units > 0]
    if not bins:
        return Timeline(unit, None, (), [], pauses, pause_ms, paused)
    segs = _segments([b.busy_ms / b.units for b in bins])
    baseline = _baseline(bins, segs)
    kinds = ["slow" if _level(bins[i:j]) >= baseline * (1 + SLOW_PCT / 100) else "steady" for i, j in segs]
    # Warm-up: the slow segments the run starts with (a compiled first step, then slower steps
    # while caches fill), within its first WARMUP_MAX_SHARE of steps.
    total, k = sum(b.steps for b in bins), 0
    while (
        k < len(segs) - 1
        and kinds[k] == "slow"
        and sum(b.steps for b in bins[: segs[k][1]]) <= WARMUP_MAX_SHARE * total
    ):
        kinds[k] = "warm-up"
        k += 1
    # Adjacent segments of one kind are one phase; a slow phase too short to matter is steady
    # (and joins its steady neighbours).
    merged = _merge([(i, j, kind) for (i, j), kind in zip(segs, kinds)])
    merged = _merge(
        [
            (
                i,
                j,
                "steady" if kind == "slow" and bins[j - 1].end_ms - bins[i].start_ms < MIN_SLOW_MS else kind,
            )
            for i, j, kind in merged
        ]
    )
    phases = tuple(_phase(kind, bins[i:j], baseline) for i, j, kind in merged)
    return Timeline(unit, baseline, phases, bins, pauses, pause_ms, paused)


def _merge(parts: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Adjacent [i, j) ranges of the same kind joined."""
    out: list[tuple[int, int, str]] = []
    for i, j, kind in parts:
        if out and out[-1][2] == kind:
            out[-1] = (out[-1][0], j, kind)
        else:
            out.append((i, j, kind))
    return out

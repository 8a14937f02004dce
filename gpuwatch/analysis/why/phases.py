"""A run's phases from its own steps: warm-up, steady, slow, pauses, profiler windows.

Step times are normalised per token (per step when the run records no tokens), so a longer
sequence is not a slowdown. The steps are summed in SQL per bin of consecutive steps (at most
MAX_BINS bins, each at least MIN_BIN_MS long: a million-step run costs one pass over its rows), pauses between steps (evaluation, checkpoints: one
step far longer than the typical one) are set apart, and a change-point search cuts the per-bin series
where its level changes (binary segmentation). A phase must span MIN_BINS bins, so one noisy bin is not a phase.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields

from gpuwatch.analysis.why.model import MIN_SLOW_MS, SLOW_PCT, Phase

MAX_BINS = 8_640          # a day of steps in 10 s bins; 1 s bins up to 2.4 h
MIN_BIN_MS = 1_000        # of typical steps
MIN_BINS = 2
# A step that takes PAUSE_FACTOR times the typical step (per token) and PAUSE_MIN_MS or more is
# a pause in the training loop (evaluation, a checkpoint), not a slow step.
PAUSE_FACTOR = 5.0
PAUSE_MIN_MS = 1_000
# Warm-up: a slow first phase ending within this share of the run's steps.
WARMUP_MAX_SHARE = 0.2
SAMPLE_ROWS = 2_000       # rows read at each of 5 places to learn the typical step


@dataclass(frozen=True)
class Bins:
    """Per-bin sums of a run's steps (numpy arrays, one entry per bin holding steps)."""
    first_step: object
    last_step: object
    start_ms: object
    end_ms: object
    steps: object
    busy_ms: object           # step time outside pauses
    units: object             # tokens (or steps) outside pauses
    wait_ms: object           # busy time spent waiting for data (data_wait_pct)
    pauses: object
    pause_ms: object


@dataclass(frozen=True)
class Timeline:
    unit: str                 # token | step
    baseline: float | None    # steady ms per unit
    phases: tuple[Phase, ...]
    bins: Bins | None
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
            (run_id, lo + int((hi - lo) * frac), SAMPLE_ROWS // 5)).fetchall()
    with_tokens = [(busy, tok) for busy, tok in rows if tok]
    unit = "token" if rows and len(with_tokens) * 2 >= len(rows) else "step"
    ratios = sorted(busy / tok for busy, tok in with_tokens) if unit == "token" else \
        sorted(busy for busy, _ in rows)
    per_row = sorted(busy for busy, _ in rows)
    return unit, (ratios[len(ratios) // 2] if ratios else None), (per_row[len(per_row) // 2] if per_row else 0.0)


def read_bins(conn: sqlite3.Connection, run_id: str) -> tuple[str, Bins | None]:
    """The run's steps summed per bin of consecutive steps, pauses set apart. A bin holds at
    least MIN_BIN_MS of typical steps, and there are at most MAX_BINS: one aggregate per bin,
    each a range of the primary key (2x faster than one GROUP BY, which sorts every row). Only
    the few bins whose slowest row looks like a pause are read again, row by row."""
    import numpy as np

    lo, hi = conn.execute("SELECT min(step), max(step) FROM steps WHERE run_id = ?", (run_id,)).fetchone()
    if lo is None:
        return "step", None
    unit, typical, row_ms = _typical(conn, run_id, lo, hi)
    if typical is None:
        return unit, None
    per_bin = max(-(-(hi - lo + 1) // MAX_BINS), int(MIN_BIN_MS // max(row_ms, 1e-3)), 1)
    units = "tokens" if unit == "token" else "n_steps"
    query = (f"SELECT min(step), max(step), min(ts_ms), max(ts_ms), sum(n_steps), total(step_time_ms * n_steps), "
             f"total({units}), total(step_time_ms * n_steps * data_wait_pct), max(step_time_ms * n_steps - ? * {units}) "
             f"FROM steps WHERE run_id = ? AND step BETWEEN ? AND ? AND step_time_ms IS NOT NULL AND {units} > 0")
    pause_at = PAUSE_FACTOR * typical
    rows = [r for r in (conn.execute(query, (pause_at, run_id, s, s + per_bin - 1)).fetchone()
                        for s in range(lo, hi + 1, per_bin)) if r[0] is not None]
    if not rows:
        return unit, None
    b = Bins(*(np.asarray(c, dtype=np.float64) for c in list(zip(*rows))[:8]),
             pauses=np.zeros(len(rows)), pause_ms=np.zeros(len(rows)))
    b.wait_ms[:] /= 100.0
    # Pauses: a row over PAUSE_FACTOR typical steps' time for its units and PAUSE_MIN_MS; the
    # run's first row (set-up, compilation) is warm-up, never a pause.
    for i in np.flatnonzero(np.asarray([r[8] for r in rows]) > 0):
        for busy, u, wait in conn.execute(
                f"SELECT step_time_ms * n_steps, {units}, coalesce(data_wait_pct, 0) / 100.0 FROM steps "
                f"WHERE run_id = ? AND step BETWEEN ? AND ? AND step > ? AND step_time_ms * n_steps > max(?, ? * {units})",
                (run_id, int(b.first_step[i]), int(b.last_step[i]), lo, PAUSE_MIN_MS, pause_at)):
            b.pauses[i] += 1
            b.pause_ms[i] += busy
            b.busy_ms[i] -= busy
            b.units[i] -= u
            b.wait_ms[i] -= busy * wait
    return unit, b


def _segments(level) -> list[tuple[int, int]]:
    """[start, end) bin ranges of constant level, by binary segmentation of log(level) with a
    squared-error cost (a change of mean), penalised by the series' own noise so that noise is no
    phase. (ruptures does the same, but importing it pulls in scipy.stats: 1.2-1.6 s, more than
    the whole analysis may take.)"""
    import numpy as np

    signal = np.log(level)
    n = len(signal)
    sigma = max(1.4826 * float(np.median(np.abs(np.diff(signal)))) / np.sqrt(2), 0.02) if n > 1 else 0.02
    penalty = 4 * sigma ** 2 * np.log(max(n, 2)) + 0.02
    csum, csq = np.concatenate(([0.0], np.cumsum(signal))), np.concatenate(([0.0], np.cumsum(signal ** 2)))

    def sse(i, j):  # squared error around the mean of [i, j), vectorised over arrays of bounds
        m = j - i
        s = csum[j] - csum[i]
        return csq[j] - csq[i] - s * s / m

    cuts, todo = [], [(0, n)]
    while todo:
        i, j = todo.pop()
        if j - i < 2 * MIN_BINS:
            continue
        k = np.arange(i + MIN_BINS, j - MIN_BINS + 1)
        gains = sse(i, j) - sse(i, k) - sse(k, j)
        best = int(np.argmax(gains))
        if gains[best] > penalty:
            cuts.append(int(k[best]))
            todo += [(i, int(k[best])), (int(k[best]), j)]
    bounds = [0, *sorted(cuts), n]
    return list(zip(bounds[:-1], bounds[1:]))


def _phase(kind: str, b: Bins, i: int, j: int, baseline: float | None) -> Phase:
    busy, units = float(b.busy_ms[i:j].sum()), float(b.units[i:j].sum())
    level = busy / units if units else None
    slower = None if level is None or not baseline else (level / baseline - 1) * 100
    return Phase(kind, int(b.start_ms[i]), int(b.end_ms[j - 1]), int(b.first_step[i]), int(b.last_step[j - 1]),
                 int(b.steps[i:j].sum()), level, slower)


def _baseline(b: Bins, segs: list[tuple[int, int]]) -> float:
    """The run's steady ms per unit: the fastest segment lasting at least a fifth of the time
    (a run slow most of the time is still measured against its normal speed), else the median bin."""
    import numpy as np

    span = float(b.end_ms[-1] - b.start_ms[0]) or 1.0
    long = [float(b.busy_ms[i:j].sum() / b.units[i:j].sum()) for i, j in segs
            if b.units[i:j].sum() and (b.end_ms[j - 1] - b.start_ms[i]) >= span / 5]
    if long:
        return min(long)
    level = b.busy_ms / np.maximum(b.units, 1e-12)
    return float(np.median(level[b.units > 0]))


def timeline(conn: sqlite3.Connection, run_id: str) -> Timeline:
    """Cut a run's steps into phases; slow phases are those at least SLOW_PCT slower per unit
    than the steady speed for at least MIN_SLOW_MS."""
    unit, b = read_bins(conn, run_id)
    if b is None:
        return Timeline(unit, None, (), None, 0, 0)
    pauses, pause_ms, paused = int(b.pauses.sum()), int(b.pause_ms.sum()), tuple(pause_phases(b))
    keep = b.units > 0
    if not keep.all():
        b = Bins(*(getattr(b, f.name)[keep] for f in fields(Bins)))
    if len(b.units) == 0:
        return Timeline(unit, None, (), None, pauses, pause_ms, paused)
    segs = _segments(b.busy_ms / b.units)
    baseline = _baseline(b, segs)
    slow_at = 1 + SLOW_PCT / 100
    kinds = []
    for i, j in segs:
        level = b.busy_ms[i:j].sum() / b.units[i:j].sum()
        kinds.append("slow" if level >= baseline * slow_at else "steady")
    total_steps = float(b.steps.sum())
    if kinds[0] == "slow" and b.steps[segs[0][0]:segs[0][1]].sum() <= WARMUP_MAX_SHARE * total_steps \
            and len(segs) > 1:
        kinds[0] = "warm-up"
    # Adjacent segments of one kind are one phase; a slow phase too short to matter is steady.
    merged: list[list] = []
    for (i, j), kind in zip(segs, kinds):
        if merged and merged[-1][2] == kind:
            merged[-1][1] = j
        else:
            merged.append([i, j, kind])
    for m in merged:
        if m[2] == "slow" and b.end_ms[m[1] - 1] - b.start_ms[m[0]] < MIN_SLOW_MS:
            m[2] = "steady"
    phases: list[Phase] = []
    for i, j, kind in merged:
        if phases and phases[-1].kind == kind:
            i = _bin_of(b, phases.pop().first_step)
        phases.append(_phase(kind, b, i, j, baseline))
    return Timeline(unit, baseline, tuple(phases), b, pauses, pause_ms, paused)


def _bin_of(b: Bins, first_step: int) -> int:
    import numpy as np

    return int(np.searchsorted(b.first_step, first_step))


def pause_phases(b: Bins) -> list[Phase]:
    """Each bin that holds a pause, as a phase (evaluation, checkpoint)."""
    return [Phase("pause", int(b.start_ms[i]), int(b.end_ms[i]), int(b.first_step[i]), int(b.last_step[i]),
                  int(b.pauses[i]), None) for i in range(len(b.pauses)) if b.pauses[i]]

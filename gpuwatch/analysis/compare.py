"""Side-by-side figures of finished or running runs, and their change against the first run."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Callable, Sequence

from gpuwatch import fmt
from gpuwatch.analysis.rundata import run_gpus, run_window
from gpuwatch.store import profiles, queries


@dataclass(frozen=True)
class Dist:
    mean: float | None
    p50: float | None
    p90: float | None


@dataclass(frozen=True)
class RunStats:
    run_id: str
    name: str | None
    status: str
    duration_ms: int
    steps: int
    tokens_per_s: Dist
    step_time_ms: Dist
    peak_mem_bytes: int | None
    mfu_mean: float | None
    gpu_util_pct: float | None  # mean over the run's GPUs of each GPU's average while it ran
    gpus: tuple[int, ...]
    # from the newest profile's trace breakdown (gpuwatch/analysis/trace), when there is one
    profile_idle_pct: float | None = None
    profile_compute_pct: float | None = None


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); q in [0, 1]."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def dist(values: list[float]) -> Dist:
    values = sorted(values)
    if not values:
        return Dist(None, None, None)
    return Dist(sum(values) / len(values), percentile(values, 0.5), percentile(values, 0.9))


def run_stats(conn: sqlite3.Connection, ref: str) -> RunStats:
    run = queries.run(conn, ref)
    rows = conn.execute("SELECT tokens_per_s, step_time_ms, mfu, mem_peak_bytes, rss_bytes FROM steps "
                        "WHERE run_id = ?", (run.run_id,)).fetchall()
    column = lambda i: [r[i] for r in rows if r[i] is not None]  # noqa: E731
    mfu = column(2)
    peaks = column(3) or column(4)  # CUDA allocator peak; a CPU-only run's is its RSS
    start, end = run_window(conn, run)
    gpus = run_gpus(conn, run)
    temporal = (profiles.latest_breakdown(conn, run.run_id) or {}).get("temporal") or {}
    return RunStats(run.run_id, run.name, run.status, end - start, len(rows), dist(column(0)),
                    dist(column(1)), max(peaks) if peaks else None,
                    sum(mfu) / len(mfu) if mfu else None, gpu_util(conn, gpus, start, end), tuple(gpus),
                    temporal.get("idle_pct"), temporal.get("compute_pct"))


def gpu_util(conn: sqlite3.Connection, gpus: Sequence[int], start_ms: int, end_ms: int) -> float | None:
    """Average utilisation of `gpus` over [start, end]; rollup tiers once raw samples are gone."""
    per_gpu = []
    for idx in gpus:
        points = queries.gpu_series(conn, idx, "gpu_util_pct", start_ms, end_ms + 1, max_points=1)
        if points and points[0].avg is not None:
            per_gpu.append(points[0].avg)
    return sum(per_gpu) / len(per_gpu) if per_gpu else None


def compare(conn: sqlite3.Connection, refs: Sequence[str]) -> list[RunStats]:
    return [run_stats(conn, ref) for ref in refs]


@dataclass(frozen=True)
class Row:
    label: str
    value: Callable[[RunStats], float | None]
    show: Callable[[float | None], str]
    higher_is_better: bool | None  # None: a change is neither good nor bad


def _ms(x):
    return fmt.MISSING if x is None else f"{x:.1f} ms"


def _pct(x):
    return fmt.MISSING if x is None else f"{x:.1f} %"


ROWS = (
    Row("tokens/s mean", lambda s: s.tokens_per_s.mean, fmt.count, True),
    Row("tokens/s p50", lambda s: s.tokens_per_s.p50, fmt.count, True),
    Row("tokens/s p90", lambda s: s.tokens_per_s.p90, fmt.count, True),
    Row("step time mean", lambda s: s.step_time_ms.mean, _ms, False),
    Row("step time p50", lambda s: s.step_time_ms.p50, _ms, False),
    Row("step time p90", lambda s: s.step_time_ms.p90, _ms, False),
    Row("peak memory", lambda s: s.peak_mem_bytes, fmt.size, False),
    Row("MFU mean", lambda s: s.mfu_mean, fmt.percent, True),
    Row("GPU util", lambda s: s.gpu_util_pct, _pct, True),
    Row("GPU idle (profile)", lambda s: s.profile_idle_pct, _pct, False),
    Row("GPU compute (profile)", lambda s: s.profile_compute_pct, _pct, True),
    Row("duration", lambda s: s.duration_ms, fmt.duration, None),
    Row("steps", lambda s: s.steps, fmt.count, None),
)


def change(base: float | None, value: float | None) -> float | None:
    """Relative change of value against base, as a fraction; None when either is missing or base is 0."""
    if base is None or value is None or base == 0:
        return None
    return (value - base) / abs(base)


def table(stats: Sequence[RunStats]) -> tuple[list[str], list[list[tuple[str, int]]]]:
    """Header and rows of cells (text, verdict): verdict +1 better than the first run, -1 worse, 0 neither."""
    header = ["", *(s.name or s.run_id for s in stats)]
    out = [[("run id", 0), *((s.run_id, 0) for s in stats)]]
    for row in ROWS:
        base = row.value(stats[0])
        cells = [(row.label, 0), (row.show(base), 0)]
        for s in stats[1:]:
            value = row.value(s)
            text, verdict = row.show(value), 0
            delta = change(base, value)
            if delta is not None:
                text += f" ({delta * 100:+.0f} %)"
                if row.higher_is_better is not None and round(delta * 100) != 0:
                    verdict = 1 if (delta > 0) == row.higher_is_better else -1
            cells.append((text, verdict))
        out.append(cells)
    out.append([("GPUs", 0), *((",".join(map(str, s.gpus)) or fmt.MISSING, 0) for s in stats)])
    out.append([("end state", 0), *((s.status, 0) for s in stats)])
    return header, out

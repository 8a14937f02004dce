"""Side-by-side figures of finished or running runs, and their change against the first run:
what differed between them (config, git commit, command), speed, memory, loss and energy."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from gpuwatch.analysis import loss as loss_mod
from gpuwatch.analysis.rundata import run_gpus, run_window
from gpuwatch.analysis.step_split import named_losses
from gpuwatch.base import fmt
from gpuwatch.store import energy as energy_mod
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
    loss_final: float | None = None
    loss_best: float | None = None
    energy_j: float | None = None  # its share of its GPUs' energy (store/energy.py)
    energy_complete: bool = True  # False: counted from energy_from_ms, older samples expired
    energy_from_ms: int | None = None
    joules_per_token: float | None = None  # over the tokens of the steps the energy covers
    # from the newest profile's trace breakdown (gpuwatch/analysis/trace), when there is one
    profile_idle_pct: float | None = None
    profile_compute_pct: float | None = None
    # Set by compare(), which sees every run: the loss at the shortest run's tokens (or steps)...
    loss_at_equal: float | None = None
    equal_at: int | None = None
    equal_unit: str | None = None
    # ...and this run's value of each config key (git commit, command) that differs among them.
    differs: dict[str, str] = field(default_factory=dict)
    # with several optimisers (a GAN's netD, netG): each one's final loss, by name
    losses_final: dict[str, float] = field(default_factory=dict)


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


def weighted_dist(pairs: list[tuple[float, int]]) -> Dist:
    """dist() of values each standing for `weight` steps (a folded steps row: its mean, n_steps)."""
    if all(w == 1 for _, w in pairs):
        return dist([v for v, _ in pairs])
    pairs = sorted(pairs)
    total = sum(w for _, w in pairs)

    def at(q: float) -> float:
        seen = 0
        for value, weight in pairs:
            seen += weight
            if seen >= q * total:
                return value
        return pairs[-1][0]

    return Dist(sum(v * w for v, w in pairs) / total, at(0.5), at(0.9))


def run_stats(conn: sqlite3.Connection, ref: str) -> RunStats:
    run = queries.run(conn, ref)
    rows = conn.execute(
        "SELECT tokens_per_s, step_time_ms, mfu, mem_peak_bytes, rss_bytes, n_steps FROM steps "
        "WHERE run_id = ?",
        (run.run_id,),
    ).fetchall()
    column = lambda i: [r[i] for r in rows if r[i] is not None]  # noqa: E731
    weighted = lambda i: [(r[i], r[5]) for r in rows if r[i] is not None]  # noqa: E731
    peaks = column(3) or column(4)  # CUDA allocator peak; a CPU-only run's is its RSS
    start, end = run_window(conn, run)
    gpus = run_gpus(conn, run)
    temporal = (profiles.latest_breakdown(conn, run.run_id) or {}).get("temporal") or {}
    final, best = loss_mod.final_and_best(loss_mod.loss_curve(conn, run.run_id))
    energy = energy_mod.run_energy(conn, {run.run_id: (start, end)}).get(run.run_id)
    mfu = weighted(2)
    return RunStats(
        run.run_id,
        run.name,
        run.status,
        end - start,
        sum(r[5] for r in rows),
        weighted_dist(weighted(0)),
        weighted_dist(weighted(1)),
        max(peaks) if peaks else None,
        sum(m * n for m, n in mfu) / sum(n for _, n in mfu) if mfu else None,
        gpu_util(conn, gpus, start, end),
        tuple(gpus),
        final,
        best,
        **_energy_fields(conn, run.run_id, energy, end),
        profile_idle_pct=temporal.get("idle_pct"),
        profile_compute_pct=temporal.get("compute_pct"),
        losses_final={
            name: points[-1][1] for name, points in named_losses(queries.steps(conn, run.run_id)).items()
        },
    )


def _energy_fields(conn: sqlite3.Connection, run_id: str, energy, end_ms: int) -> dict:
    if energy is None:
        return {}
    tokens = queries.run_tokens(conn, run_id, energy.from_ms, end_ms)
    return dict(
        energy_j=energy.joules,
        energy_complete=energy.complete,
        energy_from_ms=energy.from_ms,
        joules_per_token=energy.joules / tokens if tokens else None,
    )


def gpu_util(conn: sqlite3.Connection, gpus: Sequence[int], start_ms: int, end_ms: int) -> float | None:
    """Average utilisation of `gpus` over [start, end]; rollup tiers once raw samples are gone."""
    per_gpu = []
    for idx in gpus:
        points = queries.gpu_series(conn, idx, "gpu_util_pct", start_ms, end_ms + 1, max_points=1)
        if points and points[0].avg is not None:
            per_gpu.append(points[0].avg)
    return sum(per_gpu) / len(per_gpu) if per_gpu else None


def compare(conn: sqlite3.Connection, refs: Sequence[str]) -> list[RunStats]:
    runs = [queries.run(conn, ref) for ref in refs]
    stats = [run_stats(conn, run.run_id) for run in runs]
    curves = [loss_mod.loss_curve(conn, run.run_id) for run in runs]
    equal = loss_mod.equal_point(curves)
    keys = differing_keys(runs) if len(runs) > 1 else []
    out = []
    for s, run, curve in zip(stats, runs, curves):
        at = None if equal is None else loss_mod.loss_at(curve.axis(equal[1] == "tokens"), equal[0])
        values = described(run)
        out.append(
            replace(
                s,
                loss_at_equal=at,
                equal_at=equal and equal[0],
                equal_unit=equal and equal[1],
                differs={k: values.get(k, fmt.MISSING) for k in keys},
            )
        )
    return out


def described(run: queries.Run) -> dict[str, str]:
    """A run's config as flat 'key': 'value' text (nested keys joined by dots), then its git
    commit and command."""
    out: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = value if isinstance(value, str) else json.dumps(value)

    walk("", run.config)
    for key, value in (("git commit", run.git_commit), ("command", run.command)):
        if value:
            out[key] = value
    return out


def differing_keys(runs: Sequence[queries.Run]) -> list[str]:
    """Config keys (then git commit, command) whose values are not the same in every run; a key
    one run lacks differs."""
    described_runs = [described(r) for r in runs]
    keys: list[str] = []
    for d in described_runs:
        keys += [k for k in d if k not in keys]
    return [k for k in keys if len({d.get(k) for d in described_runs}) > 1]


def _final_loss_of(name: str) -> Callable[[RunStats], float | None]:
    """The value of a run's final loss of one optimiser (a GAN's netD), for a compare row."""
    return lambda s: s.losses_final.get(name)


@dataclass(frozen=True)
class Row:
    label: str
    value: Callable[[RunStats], float | None]
    show: Callable[[float | None], str]
    higher_is_better: bool | None  # None: a change is neither good nor bad
    prefix: Callable[[RunStats], str] = lambda s: ""  # e.g. "≥ " for energy counted in part

    def text(self, stats: RunStats) -> str:
        value = self.value(stats)
        return (self.prefix(stats) if value is not None else "") + self.show(value)


def _ms(x):
    return fmt.MISSING if x is None else f"{x:.1f} ms"


def _pct(x):
    return fmt.MISSING if x is None else f"{x:.1f} %"


def _loss(x):
    return fmt.MISSING if x is None else f"{x:.4g}"


def _partial(s: RunStats) -> str:
    return "≥ " if s.energy_j is not None and not s.energy_complete else ""


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
    Row("final loss", lambda s: s.loss_final, _loss, False),
    Row("best loss", lambda s: s.loss_best, _loss, False),
    Row("energy", lambda s: s.energy_j, fmt.kwh, False, _partial),
    Row("energy/token", lambda s: s.joules_per_token, fmt.joules_per_token, False),
    Row("duration", lambda s: s.duration_ms, fmt.duration, None),
    Row("steps", lambda s: s.steps, fmt.count, None),
)

ROWS_BY_LABEL = {row.label: row for row in ROWS}
DIFFER_WIDTH = 40  # a long command or config value is cut in the table (--json has it whole)


def change(base: float | None, value: float | None) -> float | None:
    """Relative change of value against base, as a fraction; None when either is missing or base is 0."""
    if base is None or value is None or base == 0:
        return None
    return (value - base) / abs(base)


def table(stats: Sequence[RunStats]) -> tuple[list[str], list[list[tuple[str, int]]]]:
    """Header and rows of cells (text, verdict): verdict +1 better than the first run, -1 worse, 0 neither."""
    header = ["", *(s.name or s.run_id for s in stats)]
    out = [[("run id", 0), *((s.run_id, 0) for s in stats)]]
    out += [
        [(fmt.clip(key, DIFFER_WIDTH), 0), *((fmt.clip(s.differs[key], DIFFER_WIDTH), 0) for s in stats)]
        for key in stats[0].differs
    ]
    rows = list(ROWS)
    if stats[0].equal_at is not None and len(stats) > 1:
        at = f"loss at {fmt.count(stats[0].equal_at)} {stats[0].equal_unit}"
        rows.insert(
            rows.index(ROWS_BY_LABEL["best loss"]) + 1, Row(at, lambda s: s.loss_at_equal, _loss, False)
        )
    names = list(dict.fromkeys(name for s in stats for name in s.losses_final))
    rows[rows.index(ROWS_BY_LABEL["best loss"]) + 1 : 0] = [
        Row(f"final loss {name}", _final_loss_of(name), _loss, False) for name in names
    ]
    for row in rows:
        base = row.value(stats[0])
        cells = [(row.label, 0), (row.text(stats[0]), 0)]
        for s in stats[1:]:
            value = row.value(s)
            text, verdict = row.text(s), 0
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

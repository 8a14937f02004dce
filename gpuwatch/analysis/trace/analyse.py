"""One rank's trace, or one job's traces, into the breakdown `gpuwatch trace` prints and stores."""

from __future__ import annotations

import statistics
from pathlib import Path

from gpuwatch.analysis.trace import cpu, gpu, window
from gpuwatch.analysis.trace.advice import advise
from gpuwatch.analysis.trace.reader import RankTrace, read_trace


def analyse_rank(rt: RankTrace, rank: int) -> dict:
    """The breakdown of one rank: GPU side when the trace has GPU activity, CPU side always."""
    idx = window.kept(rt)
    skip = window.last_step(rt)
    cpu_whole, cpu_steps = cpu.breakdown(rt, skip)
    out: dict = {
        "rank": rank,
        "file": rt.file,
        "gpu": bool(idx),
        "steps_analysed": len([s for s in rt.steps if s[0] != skip]),
    }
    if idx:
        top, groups = gpu.kernels(rt, idx)
        out.update(
            temporal=gpu.temporal(rt, idx),
            idle=gpu.idle(rt, idx),
            kernels=top,
            kernel_groups=groups,
            overlap_pct=gpu.overlap_pct(rt, idx),
            memcpy_us=gpu.memcpy_by_direction(rt, idx),
        )
        out["steps"] = _steps(rt, window.by_step(rt, list(range(len(rt.gpu_ts)))))
    else:
        out.update(
            temporal=None,
            idle=None,
            kernels=[],
            kernel_groups=[],
            overlap_pct=None,
            steps=[{"step": s["step"], "cpu": s} for s in cpu_steps],
        )
    out["cpu"] = cpu_whole or None
    out["operators"] = cpu.top_operators(rt)
    return out


def _steps(rt: RankTrace, steps: dict[int, list[int]]) -> list[dict]:
    """Per step, from the previous step's last GPU event to this one's last: the GPU idle while
    the next batch loads belongs to the step that waited for it."""
    out, start = [], None
    for n, idx in sorted(steps.items(), key=lambda kv: min(rt.gpu_ts[i] for i in kv[1])):
        out.append({"step": n, **_step_figures(rt, idx, start)})
        start = max(rt.gpu_end[i] for i in idx)
    return sorted(out, key=lambda s: s["step"])


def _step_figures(rt: RankTrace, idx: list[int], start: float | None) -> dict:
    t = gpu.temporal(rt, idx, start)
    i = gpu.idle(rt, idx, start)
    return {
        "idle_pct": t["idle_pct"],
        "compute_pct": t["compute_pct"],
        "non_compute_pct": t["non_compute_pct"],
        "kernel_time_us": t["kernel_time_us"],
        "idle_dataloader_pct": i["dataloader_pct"],
        "idle_host_wait_pct": i["host_wait_pct"],
        "idle_sync_pct": i["sync_pct"],
        "kernel_groups": gpu.kernels(rt, idx, top=0)[1],
        "overlap_pct": gpu.overlap_pct(rt, idx),
    }


def slowest_rank(ranks: list[dict]) -> dict | None:
    """Across ranks of one job: the rank with the most compute, and how much more than the median.

    In a synchronous job every rank's step lasts as long as the slowest one's compute (the others
    wait in NCCL), so compute time, not step time, names the straggler; on CPU-only traces, the
    time in operators.
    """
    timed = [
        (r["rank"], r["temporal"]["compute_us"] if r.get("temporal") else r["cpu"]["operators_us"])
        for r in ranks
        if r.get("temporal") or r.get("cpu")
    ]
    if len(timed) < 2:
        return None
    med = statistics.median(t for _, t in timed)
    rank, worst = max(timed, key=lambda rt: rt[1])
    return {
        "rank": rank,
        "compute_us": worst,
        "median_compute_us": med,
        "slower_pct": round(100 * (worst - med) / med, 1) if med else None,
    }


def analyse_files(paths: list[str | Path], progress=None) -> dict:
    """Analyse one trace file per rank; rank from each trace's distributedInfo, else file order.

    `progress(path)`, when given, is called as each file is started (the CLI's progress line).
    """
    ranks = []
    for order, path in enumerate(paths):
        if progress:
            progress(path)
        rt = read_trace(path)
        ranks.append(analyse_rank(rt, rt.rank if rt.rank is not None else order))
    ranks.sort(key=lambda r: r["rank"])
    out = {"ranks": ranks, "slowest": slowest_rank(ranks)}
    out["advice"] = advise(out)
    return out

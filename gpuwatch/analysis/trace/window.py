"""Which GPU events an analysis covers, and which ProfilerStep each belongs to (HTA's rules).

HTA leaves out the last profiler step (it is usually cut short when the profiler stops): with
two or more distinct ProfilerStep names in a trace, a GPU event is kept only when its launch
(the CPU event with the same correlation id) starts before the last ProfilerStep begins. A GPU
event belongs to the step whose CPU span holds its launch.
"""

from __future__ import annotations

from bisect import bisect_right

from gpuwatch.analysis.trace.reader import RankTrace


def kept(rt: RankTrace) -> list[int]:
    """Indices of the GPU events HTA's breakdowns would see for this rank."""
    n = len(rt.gpu_ts)
    if len(rt.step_names) < 2:
        return list(range(n))
    last_start = max(rt.step_marks)
    launch = rt.launch_ts
    out = []
    for i in range(n):
        c = rt.gpu_corr[i]
        t = launch.get(c) if c >= 0 else None
        if t is not None and t < last_start:
            out.append(i)
    return out


def by_step(rt: RankTrace, indices: list[int]) -> dict[int, list[int]]:
    """GPU event indices grouped by the ProfilerStep number their launch falls in."""
    steps = sorted(rt.steps, key=lambda s: s[1])
    starts = [s[1] for s in steps]
    out: dict[int, list[int]] = {}
    for i in indices:
        t = rt.launch_ts.get(rt.gpu_corr[i])
        if t is None:
            continue
        k = bisect_right(starts, t) - 1
        if k >= 0 and t < steps[k][2]:
            out.setdefault(steps[k][0], []).append(i)
    return out


def last_step(rt: RankTrace) -> int | None:
    """The step number HTA leaves out, when it leaves one out."""
    if len(rt.step_names) < 2 or not rt.steps:
        return None
    return max(rt.steps, key=lambda s: s[1])[0]

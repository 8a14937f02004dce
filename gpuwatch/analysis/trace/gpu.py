"""GPU-side breakdowns of one rank, each a pure function over a RankTrace and event indices.

Definitions follow HTA (hta/analyzers/breakdown_analysis.py, communication_analysis.py):
kernel time is first start to last end of the merged GPU activity; idle is what the merged
activity leaves uncovered; compute is the merged COMPUTATION kernels; non-compute the rest.
Overlap is the share of (merged) communication time during which compute also runs.
"""

from __future__ import annotations

from gpuwatch.analysis.trace import intervals as iv
from gpuwatch.analysis.trace.kinds import COMMUNICATION, COMPUTATION, group, kernel_type
from gpuwatch.analysis.trace.reader import RankTrace


def _pairs(rt: RankTrace, idx: list[int], want: str | None = None, types=None):
    for i in idx:
        if want is None or types[rt.gpu_name[i]] == want:
            yield rt.gpu_ts[i], rt.gpu_end[i]


def _types(rt: RankTrace) -> list[str]:
    return [kernel_type(n) for n in rt.names]


def temporal(rt: RankTrace, idx: list[int], start: float | None = None) -> dict:
    """Idle / compute / non-compute time (µs and % of kernel time), HTA's temporal breakdown.

    `start`: count from there instead of the first event (a step's share of the idle before its
    first kernel: from the previous step's last GPU event).
    """
    merged = iv.merge(_pairs(rt, idx))
    if not merged:
        return {
            "kernel_time_us": 0,
            "idle_us": 0,
            "compute_us": 0,
            "non_compute_us": 0,
            "idle_pct": None,
            "compute_pct": None,
            "non_compute_pct": None,
        }
    first = merged[0][0] if start is None else min(start, merged[0][0])
    kernel_time = merged[-1][1] - first
    idle = kernel_time - iv.total(merged)
    compute = iv.total(iv.merge(_pairs(rt, idx, COMPUTATION, _types(rt))))
    non_compute = kernel_time - compute - idle
    pct = (lambda x: round(100 * x / kernel_time, 2)) if kernel_time else (lambda x: None)
    return {
        "kernel_time_us": kernel_time,
        "idle_us": idle,
        "compute_us": compute,
        "non_compute_us": non_compute,
        "idle_pct": pct(idle),
        "compute_pct": pct(compute),
        "non_compute_pct": pct(non_compute),
    }


def idle(rt: RankTrace, idx: list[int], start: float | None = None) -> dict:
    """The GPU's idle gaps (between merged activity) attributed to what the CPU was doing.

    In order of precedence: a synchronise call (cudaStreamSynchronize, cudaDeviceSynchronize,
    `.item()`) covering the gap; the data loader's `__next__` covering it; host wait when the
    next kernel had not been launched yet when the GPU ran dry (launch-bound, HTA's host wait);
    other (launched in time, yet waiting: events, dependencies between streams). `start` as
    for temporal().
    """
    order = sorted(idx, key=lambda i: rt.gpu_ts[i])
    sync = iv.merge(rt.sync.pairs())
    loader = iv.subtract(iv.merge(rt.dataloader.pairs()), sync)
    out = {"host_wait_us": 0.0, "dataloader_us": 0.0, "sync_us": 0.0, "other_us": 0.0}
    busy_end = start
    for i in order:
        ts = rt.gpu_ts[i]
        if busy_end is not None and ts > busy_end:
            s = iv.covered(sync, busy_end, ts)
            d = iv.covered(loader, busy_end, ts)
            rest = (ts - busy_end) - s - d
            launched = rt.launch_ts.get(rt.gpu_corr[i])
            out["sync_us"] += s
            out["dataloader_us"] += d
            key = "host_wait_us" if launched is not None and launched > busy_end else "other_us"
            out[key] += rest
        end = rt.gpu_end[i]
        busy_end = end if busy_end is None else max(busy_end, end)
    total = sum(out.values())
    out["idle_us"] = total
    for k in ("host_wait", "dataloader", "sync", "other"):
        out[f"{k}_pct"] = round(100 * out[f"{k}_us"] / total, 1) if total else None
    return out


def math_attention_flags(rt: RankTrace, idx: list[int]) -> set[int]:
    """GPU events launched while SDPA's math path ran on the CPU."""
    spans = iv.merge(rt.math_attention.pairs())
    if not spans:
        return set()
    out = set()
    for i in idx:
        t = rt.launch_ts.get(rt.gpu_corr[i])
        if t is not None and iv.covered(spans, t, t + 1e-3) > 0:
            out.add(i)
    return out


def kernels(rt: RankTrace, idx: list[int], top: int = 10) -> tuple[list[dict], list[dict]]:
    """(top kernels by total time, groups by total time); shares are of summed GPU event time."""
    math = math_attention_flags(rt, idx)
    by_name: dict[int, list] = {}
    by_group: dict[str, list] = {}
    named: dict[tuple[int, bool], str] = {}  # (name id, under math SDPA) -> group, worked out once
    total = 0.0
    for i in idx:
        dur = rt.gpu_end[i] - rt.gpu_ts[i]
        total += dur
        n = rt.gpu_name[i]
        key = (n, i in math)
        g = named.get(key)
        if g is None:
            g = named[key] = group(rt.names[n], key[1])
        row = by_name.setdefault(n, [0.0, 0, g])
        row[0] += dur
        row[1] += 1
        grow = by_group.setdefault(g, [0.0, 0])
        grow[0] += dur
        grow[1] += 1

    def share(x):
        return round(100 * x / total, 2) if total else None

    names = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    top_rows = [
        {
            "name": rt.names[n],
            "group": g,
            "type": kernel_type(rt.names[n]),
            "count": c,
            "total_us": t,
            "share_pct": share(t),
        }
        for n, (t, c, g) in names
    ]
    groups = [
        {"group": g, "count": c, "total_us": t, "share_pct": share(t)}
        for g, (t, c) in sorted(by_group.items(), key=lambda kv: -kv[1][0])
    ]
    return top_rows, groups


def memcpy_by_direction(rt: RankTrace, idx: list[int]) -> dict[str, float]:
    """Memcpy time (µs) by direction (HtoD, DtoH, DtoD, ...), from the Kineto name 'Memcpy HtoD (...)'."""
    out: dict[str, float] = {}
    for i in idx:
        name = rt.names[rt.gpu_name[i]]
        if name.startswith("Memcpy"):
            key = name[7:11] if len(name) >= 11 else "?"
            out[key] = out.get(key, 0.0) + rt.gpu_end[i] - rt.gpu_ts[i]
    return out


def overlap_pct(rt: RankTrace, idx: list[int]) -> float | None:
    """Share of communication time overlapped by compute (HTA's comp_comm_overlap_pctg)."""
    types = _types(rt)
    comm = iv.merge(_pairs(rt, idx, COMMUNICATION, types))
    if not comm:
        return None
    comp = iv.merge(_pairs(rt, idx, COMPUTATION, types))
    return round(100 * iv.intersect_total(comm, comp) / iv.total(comm), 2)

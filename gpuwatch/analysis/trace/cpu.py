"""CPU-side breakdown of one rank: where each ProfilerStep's wall time went on the CPU.

Per step (the thread that ran the step): data loader (`enumerate(DataLoader)...__next__`),
optimizer (`Optimizer.step#`/`zero_grad#`), operators (any other `cpu_op`), other (Python
between operators). Each share is of the step's duration; the categories never overlap
(data loader, then optimizer, then operators take what the earlier ones left).
"""

from __future__ import annotations

from gpuwatch.analysis.trace import intervals as iv
from gpuwatch.analysis.trace.reader import RankTrace


def _ops_on(rt: RankTrace, tid: int | None):
    return [(rt.op_ts[i], rt.op_end[i]) for i in range(len(rt.op_ts)) if tid is None or rt.op_tid[i] == tid]


def step_breakdown(rt: RankTrace, lo: float, hi: float, ops: list[iv.Interval]) -> dict:
    """Data loader / optimizer / operators / other time (µs, %) within [lo, hi)."""
    wall = hi - lo
    loader = iv.clip(iv.merge(rt.dataloader.pairs()), lo, hi)
    optim = iv.subtract(iv.clip(iv.merge(rt.optimizer.pairs()), lo, hi), loader)
    taken = iv.merge(loader + optim)
    operators = iv.subtract(iv.clip(ops, lo, hi), taken)
    out = {
        "wall_us": wall,
        "dataloader_us": iv.total(loader),
        "optimizer_us": iv.total(optim),
        "operators_us": iv.total(operators),
    }
    out["other_us"] = max(0.0, wall - out["dataloader_us"] - out["optimizer_us"] - out["operators_us"])
    for k in ("dataloader", "optimizer", "operators", "other"):
        out[f"{k}_pct"] = round(100 * out[f"{k}_us"] / wall, 2) if wall else None
    return out


def breakdown(rt: RankTrace, skip_step: int | None) -> tuple[dict, list[dict]]:
    """(whole-trace breakdown over the analysed steps, per-step breakdowns)."""
    steps = sorted((s for s in rt.steps if s[0] != skip_step), key=lambda s: s[1])
    tid = steps[0][3] if steps else None
    ops = iv.merge(_ops_on(rt, tid))
    if not steps:
        if not ops:
            return {}, []
        whole = step_breakdown(rt, ops[0][0], ops[-1][1], ops)
        return whole, []
    per_step = [{"step": n, **step_breakdown(rt, lo, hi, ops)} for n, lo, hi, _ in steps]
    keys = ("wall_us", "dataloader_us", "optimizer_us", "operators_us", "other_us")
    whole = {k: sum(s[k] for s in per_step) for k in keys}
    for k in ("dataloader", "optimizer", "operators", "other"):
        whole[f"{k}_pct"] = round(100 * whole[f"{k}_us"] / whole["wall_us"], 2) if whole["wall_us"] else None
    return whole, per_step


def top_operators(rt: RankTrace, top: int = 10) -> list[dict]:
    """CPU operators by self time (inclusive time less their child operators' on the same thread)."""
    order = sorted(range(len(rt.op_ts)), key=lambda i: (rt.op_tid[i], rt.op_ts[i], -rt.op_end[i]))
    self_us: dict[int, list] = {}
    stack: list[int] = []
    tid = None
    for i in order:
        if rt.op_tid[i] != tid:
            stack, tid = [], rt.op_tid[i]
        while stack and rt.op_end[stack[-1]] <= rt.op_ts[i]:
            stack.pop()
        dur = rt.op_end[i] - rt.op_ts[i]
        row = self_us.setdefault(rt.op_name[i], [0.0, 0])
        row[0] += dur
        row[1] += 1
        if stack:
            self_us[rt.op_name[stack[-1]]][0] -= dur
        stack.append(i)
    rows = sorted(self_us.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"name": rt.names[n], "self_us": s, "calls": c} for n, (s, c) in rows]

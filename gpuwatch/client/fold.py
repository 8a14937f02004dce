"""Step events from the steps a run recorded: one per step within the transport's budget, folded
past it.

Up to STEP_EVENTS_PER_S steps a second, every step is its own event (one `steps` row). Faster
than that, a drain's steps are folded into about FOLDED_EVENTS_PER_S events a second, each
standing for a run of consecutive steps: `n_steps` of them ending at `step`, tokens and samples
summed, loss and step time their means (with the fastest and slowest step), per-optimiser losses
their means, the data wait (and the hooks' compute and evaluation shares) a share of the
window's time, a closure optimiser's evaluations summed, tokens/s the window's tokens over its
time. Counts and token sums stay exact at any rate, and the events a run sends per second stay
bounded, so the transport's queue, the daemon's rate limit and the database never see a flood.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence, TypeVar

STEP_EVENTS_PER_S = 1000  # a run below this rate gets one event (row) per step
FOLDED_EVENTS_PER_S = 100  # past it, about this many folded events a second

_T = TypeVar("_T", int, float)


class Steps(NamedTuple):
    """Consecutive steps a column at a time (read off the training thread): what a fold sums.
    Each column holds the values its steps recorded, timings and tensors already read."""

    step: Sequence[int]
    ts_ms: Sequence[int]
    step_ms: Sequence[float | None]
    wait_pct: Sequence[float | None]
    tokens: Sequence[int | None]
    samples: Sequence[int | None]
    seq_len: Sequence[int | None]
    loss: Sequence[float | None]
    losses: Sequence[Mapping[str, float | None] | None]
    alloc: Sequence[int | None]
    reserved: Sequence[int | None]
    peak: Sequence[int | None]
    rss: Sequence[int | None]
    split: Sequence[Mapping[str, Any] | None]  # what the zero-code hooks measured of each step (or None)


def group_size(n: int, span_ms: float) -> int:
    """How many steps each event stands for when `n` steps covered `span_ms`: 1 within budget."""
    if n * 1000 <= STEP_EVENTS_PER_S * span_ms:
        return 1
    events = max(1, int(FOLDED_EVENTS_PER_S * span_ms / 1000))
    return -(-n // events)


def finite_losses(losses: Mapping[str, float | None] | None) -> dict[str, float] | None:
    """The per-optimiser losses the wire accepts (finite numbers), None if none are left."""
    if not losses:
        return None
    kept = {name: value for name, value in losses.items() if value is not None and math.isfinite(value)}
    return kept or None


def _present(values: Sequence[_T | None]) -> Sequence[_T]:
    if None not in values:
        return values  # type: ignore[return-value]  # (none missing: the column itself, not a copy)
    return [v for v in values if v is not None]


def _sum(values: Sequence[int | None]) -> int | None:
    present = _present(values)
    return sum(present) if present else None


def _mean(values: Sequence[float | None]) -> float | None:
    present = _present(values)
    return math.fsum(present) / len(present) if present else None


def _max(values: Sequence[int | None]) -> int | None:
    present = _present(values)
    return max(present) if present else None


def _losses_mean(losses: Sequence[Mapping[str, float | None] | None]) -> dict[str, float] | None:
    if not any(losses):
        return None
    sums: dict[str, list[float]] = {}
    for one in losses:
        for name, value in (one or {}).items():
            if value is not None and math.isfinite(value):
                sums.setdefault(name, []).append(value)
    return {name: math.fsum(values) / len(values) for name, values in sums.items()} or None


def _split(g: Steps) -> dict[str, Any]:
    """The hooks' split of folded steps: each share weighted by its step's time, evaluations summed."""
    if not any(g.split):
        return {}
    out: dict[str, Any] = {}
    for key in ("data_wait_pct", "compute_pct", "eval_pct"):
        weighted = [
            (one[key] * ms, ms)
            for one, ms in zip(g.split, g.step_ms)
            if one and one.get(key) is not None and ms
        ]
        if weighted:
            out[key] = min(100.0, math.fsum(w for w, _ in weighted) / math.fsum(ms for _, ms in weighted))
    evals = [one["closure_evals"] for one in g.split if one and one.get("closure_evals") is not None]
    if evals:
        out["closure_evals"] = sum(evals)
    return out


def folded(g: Steps, mfu: Callable[[float | None, int | None], float | None]) -> dict[str, Any]:
    """One event's fields (without the envelope) for consecutive steps; `mfu(tps, seq_len)`:
    what only the run knows."""
    times = _present(g.step_ms)
    tokens = _sum(g.tokens)
    if None in g.tokens or None in g.step_ms:  # the time of the steps that counted tokens
        token_ms = math.fsum(ms for t, ms in zip(g.tokens, g.step_ms) if t is not None and ms)
    else:
        token_ms = math.fsum(times)
    tps = tokens / (token_ms / 1000.0) if tokens and token_ms else None
    wait_pct = None
    if any(w is not None for w in g.wait_pct):
        waited = [(w * ms, ms) for w, ms in zip(g.wait_pct, g.step_ms) if w is not None and ms]
        if waited:
            wait_pct = min(100.0, math.fsum(w for w, _ in waited) / math.fsum(ms for _, ms in waited))
    seq_len = g.seq_len[-1]
    return {
        "step": g.step[-1],
        "n_steps": len(g.step),
        "tokens": tokens,
        "samples": _sum(g.samples),
        "seq_len": seq_len,
        "loss": _mean(g.loss),
        "losses": _losses_mean(g.losses),
        "step_time_ms": math.fsum(times) / len(times) if times else None,
        "step_time_min_ms": min(times) if times else None,
        "step_time_max_ms": max(times) if times else None,
        "data_wait_pct": wait_pct,
        "tokens_per_s": tps,
        "mfu": mfu(tps, seq_len),
        "mem_allocated_bytes": g.alloc[-1],
        "mem_reserved_bytes": g.reserved[-1],
        "mem_peak_bytes": _max(g.peak),
        "rss_bytes": _max(g.rss),
        **_split(g),
    }

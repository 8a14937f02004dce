"""Step events from the steps a run recorded: one per step within the transport's budget, folded
past it.

Up to STEP_EVENTS_PER_S steps a second, every step is its own event (one `steps` row). Faster
than that, a drain's steps are folded into about FOLDED_EVENTS_PER_S events a second, each
standing for a run of consecutive steps: `n_steps` of them ending at `step`, tokens and samples
summed, loss and step time their means (with the fastest and slowest step), per-optimiser losses
their means, the data wait a share of the window's time, tokens/s the window's tokens over its
time. Counts and token sums stay exact at any rate, and the events a run sends per second stay
bounded, so the transport's queue, the daemon's rate limit and the database never see a flood.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

STEP_EVENTS_PER_S = 1000  # a run below this rate gets one event (row) per step
FOLDED_EVENTS_PER_S = 100  # past it, about this many folded events a second


class Done(NamedTuple):
    """One step whose timings and loss have been read (off the training thread)."""

    step: int
    ts_ms: int
    step_ms: float | None
    wait_pct: float | None
    tokens: int | None
    samples: int | None
    seq_len: int | None
    loss: float | None
    losses: dict | None
    alloc: int | None
    reserved: int | None
    peak: int | None
    rss: int | None


def group_size(n: int, span_ms: float) -> int:
    """How many steps each event stands for when `n` steps covered `span_ms`: 1 within budget."""
    if n * 1000 <= STEP_EVENTS_PER_S * span_ms:
        return 1
    events = max(1, int(FOLDED_EVENTS_PER_S * span_ms / 1000))
    return -(-n // events)


def finite_losses(losses: dict | None) -> dict | None:
    """The per-optimiser losses the wire accepts (finite numbers), None if none are left."""
    if not losses:
        return None
    kept = {name: value for name, value in losses.items() if value is not None and math.isfinite(value)}
    return kept or None


def _sum(values) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _mean(values) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def _max(values):
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _losses_mean(group: list[Done]) -> dict | None:
    sums: dict[str, list[float]] = {}
    for done in group:
        for name, value in (done.losses or {}).items():
            if value is not None and math.isfinite(value):
                sums.setdefault(name, []).append(value)
    return {name: math.fsum(values) / len(values) for name, values in sums.items()} or None


def folded(group: list[Done], fields: Callable[[float | None, int | None], dict]) -> dict:
    """One event's fields (without the envelope) for consecutive steps; `fields(tps, seq_len)`
    adds what only the run knows (its MFU)."""
    last = group[-1]
    times = [d.step_ms for d in group if d.step_ms is not None]
    total_ms = math.fsum(times)
    tokens = _sum(d.tokens for d in group)
    token_ms = math.fsum(d.step_ms for d in group if d.tokens is not None and d.step_ms)
    tps = tokens / (token_ms / 1000.0) if tokens and token_ms else None
    waited = [(d.wait_pct * d.step_ms, d.step_ms) for d in group if d.wait_pct is not None and d.step_ms]
    wait_pct = min(100.0, math.fsum(w for w, _ in waited) / math.fsum(t for _, t in waited)) if waited else None
    return {"step": last.step, "n_steps": len(group), "tokens": tokens,
            "samples": _sum(d.samples for d in group), "seq_len": last.seq_len,
            "loss": _mean(d.loss for d in group), "losses": _losses_mean(group),
            "step_time_ms": total_ms / len(times) if times else None,
            "step_time_min_ms": min(times) if times else None,
            "step_time_max_ms": max(times) if times else None,
            "data_wait_pct": wait_pct, "tokens_per_s": tps, **fields(tps, last.seq_len),
            "mem_allocated_bytes": last.alloc, "mem_reserved_bytes": last.reserved,
            "mem_peak_bytes": _max(d.peak for d in group), "rss_bytes": _max(d.rss for d in group)}

"""Two views of a run's steps that the zero-code hooks record: where each step's time went
(data, compute, evaluation/checkpoint, other) and each optimiser's loss by name."""

from __future__ import annotations

import json
from typing import Iterable, Sequence

PARTS = ("data", "compute", "eval/checkpoint", "other")


def split_of(step) -> dict[str, float] | None:
    """A step's shares (%) of data, compute, evaluation/checkpoint and other; None when the step
    has no compute share (recorded by track() rather than the hooks)."""
    compute = getattr(step, "compute_pct", None)
    if compute is None:
        return None
    data = step.data_wait_pct or 0.0
    aside = step.eval_pct or 0.0
    return {
        "data": data,
        "compute": compute,
        "eval/checkpoint": aside,
        "other": max(0.0, 100.0 - data - compute - aside),
    }


def mean_split(steps: Iterable) -> dict[str, float] | None:
    """The mean of the steps' splits (steps without one left out); None when none has one."""
    splits = [s for s in map(split_of, steps) if s is not None]
    if not splits:
        return None
    return {part: sum(s[part] for s in splits) / len(splits) for part in PARTS}


def named_losses(steps: Sequence) -> dict[str, list[tuple[int, float]]]:
    """name -> [(step, loss)] from the steps' per-optimiser losses, in the program's order."""
    named: dict[str, list[tuple[int, float]]] = {}
    for step in steps:
        text = getattr(step, "losses_json", None)
        if not text:
            continue
        try:
            losses = json.loads(text)
        except ValueError:
            continue
        for name, value in losses.items() if isinstance(losses, dict) else ():
            if isinstance(value, (int, float)):
                named.setdefault(str(name), []).append((step.step, float(value)))
    return named

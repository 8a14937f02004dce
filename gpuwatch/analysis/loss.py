"""Loss against tokens seen: a run's curve, and runs of different lengths compared fairly.

Runs are compared at equal tokens seen: each run's loss at the shorter run's token count,
averaged over the steps in the last EQUAL_WINDOW of it (a single step's loss is noise), or
interpolated there when no step falls in that window. Runs whose steps do not all record
tokens are compared at equal steps instead.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass
from typing import Iterable, Sequence

EQUAL_WINDOW = 0.05


@dataclass(frozen=True)
class LossCurve:
    run_id: str
    points: tuple[tuple[int, float], ...]  # (tokens seen once the step was done, loss), by step
    by_steps: tuple[tuple[int, float], ...]  # (step, loss)
    tokens_known: bool  # every step with a loss recorded its tokens

    def axis(self, tokens: bool) -> tuple[tuple[int, float], ...]:
        return self.points if tokens else self.by_steps


def loss_curve(conn: sqlite3.Connection, run_id: str) -> LossCurve:
    return curve_of(
        run_id, conn.execute("SELECT step, tokens, loss FROM steps WHERE run_id = ? ORDER BY step", (run_id,))
    )


def curve_of(run_id: str, steps: Iterable[tuple[int, int | None, float | None]]) -> LossCurve:
    """The curve of (step, tokens, loss) rows in step order."""
    seen, points, by_steps, known = 0, [], [], True
    for step, tokens, loss in steps:
        seen += tokens or 0
        if loss is None or not math.isfinite(loss):
            continue
        known = known and tokens is not None
        points.append((seen, loss))
        by_steps.append((step, loss))
    return LossCurve(run_id, tuple(points), tuple(by_steps), known and bool(points))


def final_and_best(curve: LossCurve) -> tuple[float | None, float | None]:
    losses = [loss for _, loss in curve.by_steps]
    return (losses[-1], min(losses)) if losses else (None, None)


def equal_point(curves: Sequence[LossCurve]) -> tuple[int, str] | None:
    """(x, unit) at which to compare: the shortest run's tokens (or steps) seen; None when a run
    has no loss."""
    if not curves or any(not c.by_steps for c in curves):
        return None
    tokens = all(c.tokens_known for c in curves)
    return min(c.axis(tokens)[-1][0] for c in curves), "tokens" if tokens else "steps"


def loss_at(points: Sequence[tuple[int, float]], x: int) -> float | None:
    """The loss at x: mean over the points in the last EQUAL_WINDOW of x, else interpolated."""
    near = [loss for at, loss in points if x * (1 - EQUAL_WINDOW) < at <= x]
    if near:
        return sum(near) / len(near)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None

"""Causes in the run itself: waiting for data, more tokens per step, its own profiler window."""

from __future__ import annotations

import sqlite3

from gpuwatch.analysis.why.gpu import Candidate
from gpuwatch.analysis.why.window import Window
from gpuwatch.base import fmt


def data_wait(w: Window) -> list[Candidate]:
    """The extra time per unit spent before each step's compute began (Run.mark_compute)."""
    if w.wait_extra < 0.05 * max(w.extra, 1e-9) or w.wait_extra <= 0:
        return []
    return [
        (
            w.wait_extra,
            dict(
                kind="data_wait",
                detail=f"waiting for data added {w.wait_extra * 100:.0f} % to each token's time "
                "(the data loader fell behind)",
            ),
        )
    ]


def tokens_per_step(w: Window) -> list[Candidate]:
    """Longer sequences cost more per token (attention grows with the sequence): at most the
    ratio of tokens per step; counted at half of it."""
    r = w.units_ratio
    if r is None or r < 1.2:
        return []
    return [
        (
            0.5 * (r - 1),
            dict(
                kind="tokens_per_step",
                detail=f"{r:.1f}x the tokens per step: longer sequences cost more per token",
            ),
        )
    ]


def profiler(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """Its own profiler window (profiles table): a traced step is slower."""
    rows = conn.execute(
        "SELECT id, ts_ms, first_step, steps, trigger FROM profiles WHERE run_id = ? "
        "AND ts_ms BETWEEN ? AND ?",
        (w.run.run_id, w.start_ms - 60_000, w.end_ms),
    ).fetchall()
    if not rows:
        return []
    pid, ts, first, steps, trigger = rows[0]
    return [
        (
            w.extra * 0.5,
            dict(
                kind="profiler",
                detail=f"its own {trigger} profile {pid} at {fmt.local_time(ts)}"
                + (f" (steps {first}-{first + (steps or 1) - 1})" if first is not None else ""),
            ),
        )
    ]


def stack_dumps(conn: sqlite3.Connection, w: Window) -> list[str]:
    """Stack dumps taken in the window: where to look next (`gpuwatch stacks`)."""
    return [
        f"stack dump {i} at {fmt.local_time(ts)} ({reason}): gpuwatch stacks {w.run.run_id}"
        for i, ts, reason in conn.execute(
            "SELECT id, ts_ms, reason FROM stack_dumps WHERE run_id = ? AND ts_ms BETWEEN ? AND ?",
            (w.run.run_id, *w.span()),
        )
    ]

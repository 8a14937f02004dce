"""Why did a run slow down: its phases from its own steps, and for each slow phase the causes
found in the same window of the database, each with the share of the slowdown it explains.

`analyse(conn, run_ref)` is what `gpuwatch why`, `show`, `report`, `compare` and the TUI read;
`top_cause(conn, run_id, start_ms, end_ms)` is for the `run.slow` alert rule. Pure reads.
"""

from __future__ import annotations

import sqlite3

from gpuwatch.analysis.why import gpu, host, own, ranks
from gpuwatch.analysis.why.model import Cause, Phase, Slowdown, WhyResult
from gpuwatch.analysis.why.phases import Timeline, timeline, totals
from gpuwatch.analysis.why.ranking import rank
from gpuwatch.analysis.why.window import BASE_MAX_MS, Window, make_window
from gpuwatch.store import queries

__all__ = ["Cause", "Phase", "Slowdown", "WhyResult", "analyse", "top_cause"]


def _base_span(tl: Timeline, start_ms: int, end_ms: int) -> tuple[int, int] | None:
    """The steady phase nearest the window (the one before it first), at most BASE_MAX_MS of it,
    ending before the window starts (phases meet inside a bin)."""
    steady = [p for p in tl.phases if p.kind == "steady"]
    before = [p for p in steady if p.end_ms <= start_ms]
    if before:
        p = before[-1]
        end = min(p.end_ms, start_ms - 1)
        return max(p.start_ms, end - BASE_MAX_MS), end
    after = [p for p in steady if p.start_ms >= end_ms]
    if after:
        p = after[0]
        begin = max(p.start_ms, end_ms + 1)
        return begin, min(p.end_ms, begin + BASE_MAX_MS)
    return None


def _window(
    conn: sqlite3.Connection, run: queries.Run, tl: Timeline, start_ms: int, end_ms: int
) -> Window | None:
    base = _base_span(tl, start_ms, end_ms)
    if base is None:
        return None
    now, was = totals(tl.bins, start_ms, end_ms), totals(tl.bins, *base)
    if now is None or was is None:
        return None
    level, base_level = now[0] / now[1], was[0] / was[1]
    units_ratio = None
    if tl.unit == "token" and now[3] and was[3]:
        units_ratio = (now[1] / now[3]) / (was[1] / was[3])
    return make_window(
        conn,
        run,
        start_ms,
        end_ms,
        base,
        extra=level / base_level - 1,
        wait_extra=(now[2] / now[1] - was[2] / was[1]) / base_level,
        units_ratio=units_ratio,
    )


def explain(conn: sqlite3.Connection, w: Window) -> tuple[Cause, ...]:
    """Every cause family's candidates for the window, ranked."""
    found = (
        gpu.cotenants(conn, w)
        + gpu.gpu_state(conn, w)
        + host.cpu(conn, w)
        + host.memory(conn, w)
        + own.data_wait(w)
        + own.tokens_per_step(w)
        + own.profiler(conn, w)
        + ranks.straggler(conn, w)
    )
    return rank(found, max(w.extra, 0.0))


def analyse(conn: sqlite3.Connection, run_ref: str) -> WhyResult:
    """The run's phases and its slowdowns, each with its ranked causes."""
    run = queries.run(conn, run_ref)
    tl = timeline(conn, run.run_id)
    slowdowns = []
    notes: list[str] = []
    for p in tl.phases:
        if p.kind != "slow":
            continue
        w = _window(conn, run, tl, p.start_ms, p.end_ms)
        causes = explain(conn, w) if w else (Cause("unexplained", 100.0, "no steady phase to compare with"),)
        if w:
            notes += own.stack_dumps(conn, w)
        slowdowns.append(
            Slowdown(p.start_ms, p.end_ms, p.first_step, p.last_step, p.slower_pct or 0.0, causes, p.steps)
        )
    phases = tuple(
        sorted(
            tl.phases + tl.pause_phases + _profiler_phases(conn, run.run_id),
            key=lambda p: (p.start_ms, p.first_step),
        )
    )
    return WhyResult(
        run.run_id,
        run.name,
        tl.unit,
        tl.baseline,
        phases,
        tuple(slowdowns),
        tl.pauses,
        tl.pause_ms,
        tuple(notes),
    )


def _profiler_phases(conn: sqlite3.Connection, run_id: str) -> tuple[Phase, ...]:
    """The run's profiles, each over the steps it traced (from the time it was taken when the
    steps are not known)."""
    out = []
    for ts, first, n in conn.execute(
        "SELECT ts_ms, first_step, steps FROM profiles WHERE run_id = ? ORDER BY ts_ms", (run_id,)
    ).fetchall():
        last = None if first is None else first + max((n or 1) - 1, 0)
        span = (
            conn.execute(
                "SELECT min(ts_ms), max(ts_ms) FROM steps WHERE run_id = ? AND step BETWEEN ? AND ?",
                (run_id, first, last),
            ).fetchone()
            if first is not None
            else (None, None)
        )
        out.append(Phase("profiler", span[0] or ts, span[1] or ts, first or 0, last or 0, n or 0, None))
    return tuple(out)


def top_cause(conn: sqlite3.Connection, run_id: str, start_ms: int, end_ms: int) -> Cause | None:
    """The first-ranked cause of the run's speed in [start_ms, end_ms] against its nearest
    steady phase (for the run.slow alert); None when nothing can be said."""
    run = queries.run(conn, run_id)
    tl = timeline(conn, run.run_id)
    w = _window(conn, run, tl, start_ms, end_ms)
    if w is None or w.extra <= 0:
        return None
    causes = explain(conn, w)
    return causes[0] if causes else None

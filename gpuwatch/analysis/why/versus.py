"""`compare`'s answer to "where was this run slower than that one, per token, and why": the
steady speeds of the two runs side by side, the evidence of one run's steady window against
the other's, and the slow phases of the slower one."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from gpuwatch.analysis.why import explain
from gpuwatch.analysis.why.model import SLOW_PCT, Cause, Slowdown
from gpuwatch.analysis.why.phases import Timeline, timeline, totals
from gpuwatch.analysis.why.window import BASE_MAX_MS, make_window
from gpuwatch.store import queries


@dataclass(frozen=True)
class Versus:
    run_id: str
    than_run_id: str
    unit: str
    slower_pct: float | None  # steady speed per unit, against the other run's
    causes: tuple[Cause, ...]  # why, when it is SLOW_PCT or more slower
    slowdowns: tuple[Slowdown, ...]  # its own slow phases (gpuwatch why)


def _steady(tl: Timeline) -> tuple[int, int] | None:
    """The longest steady phase, at most BASE_MAX_MS of its end."""
    steady = [p for p in tl.phases if p.kind == "steady"]
    if not steady:
        return None
    p = max(steady, key=lambda p: p.end_ms - p.start_ms)
    return max(p.start_ms, p.end_ms - BASE_MAX_MS), p.end_ms


def versus(conn: sqlite3.Connection, ref: str, than_ref: str) -> Versus:
    from gpuwatch.analysis.why import analyse

    run, than = queries.run(conn, ref), queries.run(conn, than_ref)
    mine, theirs = timeline(conn, run.run_id), timeline(conn, than.run_id)
    slowdowns = analyse(conn, run.run_id).slowdowns
    span, base = _steady(mine), _steady(theirs)
    if span is None or base is None or mine.unit != theirs.unit:
        return Versus(run.run_id, than.run_id, mine.unit, None, (), slowdowns)
    now, was = totals(mine.bins, *span), totals(theirs.bins, *base)
    if now is None or was is None:
        return Versus(run.run_id, than.run_id, mine.unit, None, (), slowdowns)
    (busy, units, wait, _), (busy0, units0, wait0, _) = now, was
    level, level0 = busy / units, busy0 / units0
    extra = level / level0 - 1
    causes: tuple[Cause, ...] = ()
    if extra * 100 >= SLOW_PCT:
        # The same cause families, judged on this run's steady window against the other's.
        w = make_window(
            conn,
            run,
            span[0],
            span[1],
            base,
            extra=extra,
            wait_extra=(wait / units - wait0 / units0) / level0,
            units_ratio=None,
        )
        causes = explain(conn, w)
    return Versus(run.run_id, than.run_id, mine.unit, extra * 100, causes, slowdowns)


def lines(v: Versus, name: str, than_name: str) -> list[str]:
    out = []
    if v.slower_pct is None:
        out.append(f"{name}: no steady phase to compare per {v.unit} with {than_name}")
    else:
        word = "slower" if v.slower_pct >= 0 else "faster"
        out.append(f"{name}: steady speed {abs(v.slower_pct):.0f} % {word} per {v.unit} than {than_name}")
        out += [f"  {c.share_pct:5.1f} %  {c.kind:<15} {c.detail}" for c in v.causes]
    for s in v.slowdowns:
        top = s.causes[0] if s.causes else None
        out.append(
            f"  slow steps {s.first_step:,}-{s.last_step:,}: {s.slower_pct:.0f} % slower per {v.unit}"
            + (f", mostly {top.kind}: {top.detail}" if top else "")
        )
    return out

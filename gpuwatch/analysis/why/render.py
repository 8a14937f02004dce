"""`gpuwatch why` as text: the phases, then each slowdown with its ranked causes."""

from __future__ import annotations

from gpuwatch.analysis.why.model import MIN_SLOW_MS, SLOW_PCT, WhyResult
from gpuwatch.base import fmt


def _span(start_ms: int, end_ms: int) -> str:
    return f"{fmt.local_time(start_ms)} +{fmt.duration(end_ms - start_ms)}"


def _steps(first: int, last: int) -> str:
    return f"{first:,}" if first == last else f"{first:,}-{last:,}"


def none_found(unit: str) -> str:
    return f"none (no phase {SLOW_PCT:.0f} % or more slower per {unit} for {MIN_SLOW_MS // 1000} s or more)"


def slowdown_lines(r: WhyResult, indent: str = "  ") -> list[str]:
    """One line per slowdown and one per cause: the "slowdowns" section of `show`."""
    if not r.slowdowns:
        return [indent + none_found(r.unit)]
    out = []
    for s in r.slowdowns:
        out.append(
            f"{indent}steps {s.first_step:,}-{s.last_step:,}  {_span(s.start_ms, s.end_ms)}  "
            f"{s.slower_pct:.0f} % slower per {r.unit}"
        )
        for c in s.causes:
            out.append(f"{indent}  {c.share_pct:5.1f} %  {c.kind:<15} {c.detail}")
    return out


def text(r: WhyResult) -> str:
    out = [f"run {r.run_id}" + (f"  {r.name}" if r.name else "")]
    if r.baseline_ms_per_unit is None:
        out.append("  no timed steps: nothing to cut into phases")
        return "\n".join(out)
    per = "1k tokens" if r.unit == "token" else "step"
    scale = 1000 if r.unit == "token" else 1
    out.append(
        f"  steady speed {r.baseline_ms_per_unit * scale:.3g} ms per {per}; "
        f"{r.pauses} pauses between steps ({fmt.duration(r.pause_ms)})"
    )
    out.append("")
    out.append("phases")
    shown = [p for p in r.phases if p.kind != "pause"]
    for p in shown:
        speed = "" if p.ms_per_unit is None else f"{p.ms_per_unit * scale:.3g} ms/{per}"
        slower = f"  {p.slower_pct:+.0f} %" if p.slower_pct is not None and p.kind != "steady" else ""
        out.append(
            f"  {p.kind:<9} steps {_steps(p.first_step, p.last_step)}  {_span(p.start_ms, p.end_ms)}  "
            f"{speed}{slower}"
        )
    pauses = [p for p in r.phases if p.kind == "pause"]
    if pauses:
        listed = ", ".join(_steps(p.first_step, p.last_step) for p in pauses[:6])
        out.append(
            f"  pauses    around steps {listed}{' ...' if len(pauses) > 6 else ''} "
            "(evaluation, checkpoints: not counted as slow)"
        )
    out.append("")
    out.append("slowdowns")
    out += slowdown_lines(r)
    if r.notes:
        out.append("")
        out += [f"  {n}" for n in r.notes]
    return "\n".join(out)

"""Shares of a slowdown: each cause's expected extra time against the extra time seen."""

from __future__ import annotations

from gpuwatch.analysis.why.gpu import Candidate
from gpuwatch.analysis.why.model import Cause

UNEXPLAINED_MIN_PCT = 10.0


def rank(candidates: list[Candidate], extra: float) -> tuple[Cause, ...]:
    """Causes ranked by the share of the extra time they explain. When their expected extras
    add up to more than was seen, they split it in proportion; what none explains is
    "unexplained" (shown when it is UNEXPLAINED_MIN_PCT or more)."""
    candidates = [(e, f) for e, f in candidates if e > 0]
    total = sum(e for e, _ in candidates)
    scale = 100 / max(total, extra) if max(total, extra) > 0 else 0.0
    causes = [Cause(share_pct=round(e * scale, 1), **f) for e, f in candidates]
    causes.sort(key=lambda c: -c.share_pct)
    rest = 100 - sum(c.share_pct for c in causes)
    if rest >= UNEXPLAINED_MIN_PCT:
        causes.append(
            Cause("unexplained", round(rest, 1), "no evidence in this window's samples for the rest")
        )
    return tuple(causes)

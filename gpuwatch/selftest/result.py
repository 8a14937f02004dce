"""What a check says: ok, FAIL or skipped, with the two figures it compared."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"


@dataclass(frozen=True)
class Result:
    check: str
    status: str  # ok | FAIL | skipped
    detail: str  # what was compared, or why it was skipped
    tolerance: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def within(check: str, ours, theirs, allowed, unit: str = "", tolerance: str = "") -> Result:
    """ok when |ours - theirs| <= allowed; either side None counts only when both are."""
    if ours is None or theirs is None:
        if ours is None and theirs is None:
            return Result(check, OK, "not available from either (both n/a)", tolerance)
        return Result(
            check,
            FAIL,
            f"gpuwatch {_show(ours, unit)} vs {_show(theirs, unit)}: one side has no value",
            tolerance,
        )
    status = OK if abs(ours - theirs) <= allowed else FAIL
    return Result(check, status, f"gpuwatch {_show(ours, unit)} vs {_show(theirs, unit)}", tolerance)


def _show(value, unit: str) -> str:
    if value is None:
        return "n/a"
    text = (
        (f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}") if isinstance(value, float) else str(value)
    )
    return f"{text} {unit}".rstrip()


Progress = Callable[[str], None]

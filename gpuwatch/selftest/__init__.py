"""`gpuwatch selftest`: does the monitor tell the truth on this machine?

Each check compares a figure gpuwatch measures with an independent one taken at the same time
(nvidia-smi, torch's own synchronised timings and allocator, psutil, the database itself) and
says ok, FAIL or skipped (with why). The comparisons are pure functions of the two figures, so
they are tested without a GPU; the measuring lives beside them.
"""

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


def run(quick: bool = False, progress: Progress = lambda _: None) -> list[Result]:
    """Every check that applies here; GPU checks skip (with why) where no GPU answers."""
    from gpuwatch.selftest import cuda, gpm, host, smi

    results: list[Result] = []
    for name, check in host.CHECKS:
        progress(name)
        results += check()
    progress("NVML vs nvidia-smi")
    results += smi.check_gpus()
    results += smi.check_tick_cost()
    progress("GPM vs a known load")
    results += gpm.check()
    results += cuda.run_checks(quick, progress)
    return results

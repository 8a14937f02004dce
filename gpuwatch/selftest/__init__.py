"""`gpuwatch selftest`: does the monitor tell the truth on this machine?

Each check compares a figure gpuwatch measures with an independent one taken at the same time
(nvidia-smi, torch's own synchronised timings and allocator, psutil, the database itself) and
says ok, FAIL or skipped (with why). The comparisons are pure functions of the two figures, so
they are tested without a GPU; the measuring lives beside them.
"""

from __future__ import annotations

from gpuwatch.selftest.result import Progress, Result


def run(quick: bool = False, progress: Progress = lambda _: None) -> list[Result]:
    """Every check that applies here; GPU checks skip (with why) where no GPU answers."""
    from gpuwatch.selftest import cuda, gpm, host, smi  # here: `gpuwatch doctor` needs none of them

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

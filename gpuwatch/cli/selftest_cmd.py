"""`gpuwatch selftest`: does gpuwatch tell the truth on this machine? (ok / FAIL / skipped)"""

from __future__ import annotations

import json
import sys

import click

from gpuwatch.cli.options import friendly_errors
from gpuwatch.cli.query_cmd import format_table


@click.command("selftest")
@click.option("--quick", is_flag=True, help="The checks that take seconds (about a minute on a GPU).")
@click.option("--json", "as_json", is_flag=True, help="Results as JSON, for scripts.")
@friendly_errors
def selftest_cmd(quick: bool, as_json: bool) -> None:
    """Check gpuwatch's figures against independent ones taken at the same time: NVML vs
    nvidia-smi, CUDA-event step times vs synchronised wall time, a real CUDA OOM's postmortem and
    advice, allocator stats, profiler device times, a CUDA process, MIG devices, the host, the
    database, the daemon's socket and py-spy. Checks that need a GPU say skipped where none is.
    Exits 1 if any check FAILs.

    Run it after installing gpuwatch on a GPU server: whole run <= 5 min, --quick <= 1 min.
    """
    from gpuwatch.selftest import run
    from gpuwatch.selftest.result import FAIL

    def progress(name: str) -> None:
        click.echo(f"checking {name} ...", err=True)

    results = run(quick=quick, progress=progress)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        rows = [(r.check, r.status, r.detail, r.tolerance) for r in results]
        click.echo(
            format_table(
                ["CHECK", "RESULT", "DETAIL", "TOLERANCE"],
                rows,
                width=160 if not sys.stdout.isatty() else click.get_terminal_size()[0],
            )
        )
        failed = sum(r.status == FAIL for r in results)
        click.echo(
            f"{len(results) - failed} of {len(results)} checks not failed, {failed} FAIL"
            f" ({sum(r.status == 'skipped' for r in results)} skipped)",
            err=True,
        )
    if any(r.status == FAIL for r in results):
        raise SystemExit(1)

"""`gpuwatch selftest`: compare gpuwatch's figures with independent ones on this machine. Exits 1 on a FAIL."""

from __future__ import annotations

import click

from gpuwatch.cli.options import friendly_errors

_COLOUR = {"ok": "green", "FAIL": "red", "skipped": "yellow"}


@click.command("selftest")
@click.option("--quick", is_flag=True, help="Fewer steps and ticks: about a minute instead of five.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON (progress still goes to stderr).")
@friendly_errors
def selftest_cmd(quick, as_json):
    """Check that gpuwatch tells the truth on this machine: NVML fields against nvidia-smi, its own
    CUDA process against nvidia-smi's process list, CUDA-event step times against synchronised wall
    time, a real CUDA OOM's postmortem and advice, allocator stats keys, profiler device times,
    the sampler's tick time, MIG; and without a GPU the host, database, daemon socket and py-spy.

    Each line says ok, FAIL or skipped (with why). Exit status 1 when any check failed.
    """
    import shutil

    from gpuwatch import selftest

    env = selftest.Env(quick=quick)
    try:
        results = selftest.run(env)
    finally:
        shutil.rmtree(env.scratch, ignore_errors=True)
    if as_json:
        click.echo(selftest.as_json(results))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            click.echo(f"{click.style(r.status.ljust(7), fg=_COLOUR[r.status])}  {r.name.ljust(width)}  {r.detail}")
        failed = sum(r.status == "FAIL" for r in results)
        skipped = sum(r.status == "skipped" for r in results)
        click.echo(f"\n{len(results) - failed - skipped} ok, {failed} failed, {skipped} skipped")
    if not selftest.passed(results):
        raise SystemExit(1)

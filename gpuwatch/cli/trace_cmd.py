"""`gpuwatch trace FILE...`: where the step went, from torch.profiler traces (one file per rank)."""

from __future__ import annotations

import json

import click


@click.command("trace")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "fmt_",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="A readable table, or JSON for scripts.",
)
@click.option(
    "--width", type=click.IntRange(40, 400), default=80, show_default=True, help="Table width in columns."
)
def trace_cmd(files, fmt_, width) -> None:
    """Analyse torch.profiler/Kineto traces (.json or .json.gz, one per rank): GPU idle vs
    compute vs communication, what the idle waits for, top kernels, overlap, slowest rank, and
    advice. The same numbers as Holistic Trace Analysis.

    Example: gpuwatch trace rank0.json.gz rank1.json.gz
    """
    import os
    import sys

    from gpuwatch.analysis.trace import TraceError, analyse_files
    from gpuwatch.base import fmt

    def progress(path) -> None:
        try:
            size = fmt.size(os.path.getsize(path))
        except OSError:
            return  # the reader says what is wrong with it
        click.echo(f"reading {path} ({size})…", err=True)

    try:
        result = analyse_files(list(files), progress if sys.stderr.isatty() else None)
    except TraceError as e:
        raise click.ClickException(str(e)) from None
    if fmt_ == "json":
        click.echo(json.dumps(result, indent=1))
    else:
        from gpuwatch.analysis.trace.render import table

        click.echo(table(result, width))

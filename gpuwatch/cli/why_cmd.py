"""`gpuwatch why`: where a run slowed down, and why."""

from __future__ import annotations

import json
from contextlib import closing

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path


@click.command("why")
@click.argument("run")
@click.option(
    "--format",
    "fmt_",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table: phases and ranked causes; json: the slowdowns as one document.",
)
@db_option
@friendly_errors
def why_cmd(run, fmt_, db):
    """Say where RUN slowed down per token and why: its phases (warm-up, steady, slow, pauses,
    profiler windows) and, for each slowdown, its steps, how much slower, and the causes found
    in the same window (co-tenants on its GPUs, throttling, CPU hogs, swapping, data wait,
    a straggling rank), each with the share of the slowdown it explains.

    Example: gpuwatch why gpt-4k --format json
    """
    from gpuwatch.analysis.why import analyse
    from gpuwatch.analysis.why.render import text
    from gpuwatch.store import open_ro

    with closing(open_ro(reader_db_path(db))) as conn:
        result = analyse(conn, run)
    click.echo(json.dumps(result.to_json(), indent=1) if fmt_ == "json" else text(result))

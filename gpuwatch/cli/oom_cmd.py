"""`gpuwatch oom [RUN]`: list OOM postmortems, or show one run's in full."""

from __future__ import annotations

import click

from gpuwatch.analysis.postmortem_text import list_text, show_text
from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path


@click.command("oom")
@click.argument("run_ref", metavar="[RUN]", required=False)
@click.option(
    "--limit", type=click.IntRange(1), default=50, show_default=True, help="How many postmortems to list."
)
@db_option
@friendly_errors
def oom_cmd(run_ref, limit, db) -> None:
    """List OOM postmortems (FREE: GPU free memory, or the host's tightest bound), or show RUN's: requested vs free memory, other processes on the GPU,
    advice computed from the numbers, largest blocks and the traceback's last lines.

    RUN is a run id, a unique id prefix, or a run name (the newest run with that name).

    Examples: gpuwatch oom          gpuwatch oom gpt-4k
    """
    from gpuwatch.store import open_ro, postmortems, queries

    conn = open_ro(reader_db_path(db))
    try:
        if run_ref is None:
            click.echo(list_text(postmortems.recent(conn, limit)))
            return
        run = queries.run(conn, run_ref)
        found = postmortems.for_run(conn, run.run_id)
    finally:
        conn.close()
    if not found:
        raise click.ClickException(f"run {run.run_id} has no OOM postmortem (status: {run.status})")
    click.echo(show_text(run, found))

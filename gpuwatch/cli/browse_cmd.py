"""`gpuwatch browse`: the database in Datasette, read-only, on loopback behind a token."""

from __future__ import annotations

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path


@click.command("browse")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8001,
    show_default=True,
    help="Loopback port to serve on (0: any free one).",
)
@db_option
@friendly_errors
def browse_cmd(port, db) -> None:
    """Browse the database in Datasette: tables with units, canned queries with charts.

    Read-only, on 127.0.0.1 only, behind the random token in the printed URL; from another
    machine, tunnel it: ssh -L 8001:127.0.0.1:8001 server. Needs the browse extra:
    pip install 'gpuwatch[browse]'.

    Example: gpuwatch browse --port 8001
    """
    try:
        from gpuwatch.browse import server
    except ImportError as e:
        raise click.ClickException(
            f"gpuwatch browse needs Datasette ({e.name} is missing): pip install 'gpuwatch[browse]'"
        ) from None
    try:
        server.serve(reader_db_path(db), port)
    except OSError as e:
        raise click.ClickException(f"cannot serve on 127.0.0.1:{port}: {e.strerror or e}") from None

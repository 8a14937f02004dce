"""`gpuwatch tui`: the live terminal dashboard (textual is imported only when it runs)."""

from __future__ import annotations

import os
import sys

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path


@click.command("tui")
@db_option
@click.option("--refresh", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between updates.")
@click.option("--user", help="Start with processes and runs filtered to this user.")
@friendly_errors
def tui(db: str | None, refresh: float, user: str | None) -> None:
    """Live GPUs, processes and runs in the terminal; built for SSH (q quits, ? for keys)."""
    run_tui(reader_db_path(db), refresh, user)


def on_a_terminal() -> bool:
    return os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())


def run_tui(path: str, refresh: float = 1.0, user: str | None = None,
            start_mode: str = "overview") -> None:
    """Open the TUI on the database at `path`; `start_mode` is "overview" or "runs"."""
    from gpuwatch.store import open_ro

    if not on_a_terminal():
        raise click.ClickException("gpuwatch tui needs a terminal; for scripts use "
                                   "`gpuwatch status` or `gpuwatch query`")
    open_ro(path).close()  # a wrong path or schema is one clear line, not a screen of errors

    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.source import StoreSource

    app = GpuwatchApp(StoreSource(path), refresh_s=refresh, user=user, start_mode=start_mode)
    app.run()
    if app.return_code:
        sys.exit(app.return_code)

"""`gpuwatch tui`: the live terminal dashboard (textual is imported only when it runs)."""

from __future__ import annotations

import os
import sys

import click

from gpuwatch.cli.options import db_option, friendly_errors, load_config, reader_db_path


@click.command("tui")
@db_option
@click.option("--refresh", type=click.FloatRange(min=0.2), default=1.0, show_default=True,
              help="Seconds between updates.")
@click.option("--user", help="Start with processes and runs filtered to this user.")
@click.option("--prometheus", metavar="URL",
              help="Open the Fleet screen (F) on this Prometheus: every host's GPUs and jobs "
                   "(default: prometheus_url in the config).")
@friendly_errors
def tui(db: str | None, refresh: float, user: str | None, prometheus: str | None) -> None:
    """Live GPUs, processes and runs in the terminal; built for SSH (q quits, ? for keys)."""
    cfg = load_config()
    run_tui(reader_db_path(db), refresh, user, start_mode="fleet" if prometheus else "overview",
            prometheus_url=prometheus or cfg.prometheus_url or None,
            prometheus_timeout=cfg.prometheus_timeout)


def on_a_terminal() -> bool:
    return os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())


def run_tui(path: str, refresh: float = 1.0, user: str | None = None,
            start_mode: str = "overview", prometheus_url: str | None = None,
            prometheus_timeout: float = 3.0) -> None:
    """Open the TUI on the database at `path`; `start_mode` is "overview", "runs" or "fleet"
    (the Fleet screen reads `prometheus_url`)."""
    from gpuwatch.store import open_ro

    if not on_a_terminal():
        raise click.ClickException("gpuwatch tui needs a terminal; for scripts use "
                                   "`gpuwatch status` or `gpuwatch query`")
    if start_mode != "fleet":  # a login node may have no store of its own, only the fleet
        open_ro(path).close()  # a wrong path or schema is one clear line, not a screen of errors

    from gpuwatch.fleet.prometheus import PrometheusError
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.fleet_source import PrometheusSource
    from gpuwatch.tui.source import StoreSource

    try:
        fleet = PrometheusSource(prometheus_url, prometheus_timeout) if prometheus_url else None
    except PrometheusError as e:
        raise click.ClickException(str(e)) from None
    app = GpuwatchApp(StoreSource(path), refresh_s=refresh, user=user, start_mode=start_mode, fleet=fleet)
    app.run()
    if app.return_code:
        sys.exit(app.return_code)

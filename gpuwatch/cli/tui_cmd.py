"""`gpuwatch tui`: the live terminal dashboard (textual is imported only when it runs)."""

from __future__ import annotations

import gc
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
@click.option("--web", "web", metavar="[HOST:]PORT",
              help="Serve the TUI to a browser instead (loopback unless HOST says otherwise).")
@click.option("--web-allow-remote", is_flag=True, help="Allow --web on an address other hosts can reach.")
@friendly_errors
def tui(db: str | None, refresh: float, user: str | None, prometheus: str | None, web: str | None,
        web_allow_remote: bool) -> None:
    """Live GPUs, processes and runs in the terminal (or a browser: --web); built for SSH (q quits, ? for keys)."""
    if web:
        serve_web(reader_db_path(db), refresh, user, web, web_allow_remote, prometheus)
        return
    cfg = load_config()
    run_tui(reader_db_path(db), refresh, user, start_mode="fleet" if prometheus else "overview",
            prometheus_url=prometheus or cfg.prometheus_url or None,
            prometheus_timeout=cfg.prometheus_timeout)


def on_a_terminal() -> bool:
    return os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())


def served_to_a_browser() -> bool:
    """Whether textual-serve started us (it picks Textual's web driver for its app processes)."""
    return os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver")


def serve_web(path: str, refresh: float, user: str | None, address: str, allow_remote: bool,
              prometheus: str | None = None) -> None:
    """Serve the TUI on the database at `path` to browsers at `address`, until Ctrl+C."""
    from gpuwatch.store import open_ro

    try:
        from gpuwatch.tui import web
    except ImportError:
        raise click.ClickException("gpuwatch tui --web needs textual-serve: "
                                   "pip install 'gpuwatch[web]'") from None
    try:
        host, port = web.parse_address(address)
    except web.WebAddressError as e:
        raise click.ClickException(str(e)) from None
    if not allow_remote and not web.is_loopback(host):
        raise click.ClickException(f"--web {address}: {host} is not a loopback address; other hosts could "
                                   "reach it. Use an SSH tunnel (see the README), or add --web-allow-remote")
    open_ro(path).close()  # a wrong path or schema is one clear line, not a page of errors
    try:
        web.TokenServer(web.tui_command(path, refresh, user, prometheus), host, port).serve()
    except OSError as e:
        raise click.ClickException(f"--web {address}: cannot listen there: {e.strerror or e}") from None


def run_tui(path: str, refresh: float = 1.0, user: str | None = None,
            start_mode: str = "overview", prometheus_url: str | None = None,
            prometheus_timeout: float = 3.0) -> None:
    """Open the TUI on the database at `path`; `start_mode` is "overview", "runs" or "fleet"
    (the Fleet screen reads `prometheus_url`)."""
    from gpuwatch.store import open_ro

    if not on_a_terminal() and not served_to_a_browser():
        raise click.ClickException("gpuwatch tui needs a terminal; for scripts use "
                                   "`gpuwatch status` or `gpuwatch query`")
    if start_mode != "fleet":  # a login node may have no store of its own, only the fleet
        open_ro(path).close()  # a wrong path or schema is one clear line, not a screen of errors

    if not (prometheus_url or "").startswith("https:"):
        # asyncio loads TLS support if it can: 4 MB of a TUI that opens no TLS connection, on
        # a server where twenty people may keep one open.
        sys.modules.setdefault("ssl", None)
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.source import StoreSource

    fleet = None
    if prometheus_url:  # an HTTP client only for a fleet to read
        from gpuwatch.fleet.prometheus import PrometheusError
        from gpuwatch.tui.fleet_source import PrometheusSource

        try:
            fleet = PrometheusSource(prometheus_url, prometheus_timeout)
        except PrometheusError as e:
            raise click.ClickException(str(e)) from None
    app = GpuwatchApp(StoreSource(path), refresh_s=refresh, user=user, start_mode=start_mode, fleet=fleet)
    # Textual's rendered lines (Strips) keep themselves in their own caches, so each repaint
    # leaves cycles that only a full collection frees, and Python runs one only every ~70,000
    # allocations: a TUI left open swung 5-8 MB above its need. What the imports built is never
    # garbage: freeze it, and collect the rest fully every ~7,000 allocations (a few ms).
    gc.collect()
    gc.freeze()
    gc.set_threshold(700, 10, 1)
    app.run()
    if app.return_code:
        sys.exit(app.return_code)

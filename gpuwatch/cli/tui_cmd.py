"""`gpuwatch tui`: the live terminal dashboard (textual is imported only when it runs)."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from typing import Any

import click

from gpuwatch.base import paths
from gpuwatch.base.config import Config
from gpuwatch.cli.options import db_option, friendly_errors, load_config, reader_db_path

# Shown on the TUI's top line while it samples in its own process.
NO_DAEMON_NOTICE = "no daemon: history starts now · sudo gpuwatch install-service keeps it"
FIRST_TICK_WAIT_S = 1.0  # the first samples are stored before the first screen asks for them
FRESH_MS = 10_000  # samples this new: someone (an embedded run) samples the database already


@click.command("tui")
@db_option
@click.option(
    "--refresh",
    type=click.FloatRange(min=0.2),
    default=1.0,
    show_default=True,
    help="Seconds between updates.",
)
@click.option("--user", help="Start with processes and runs filtered to this user.")
@click.option(
    "--prometheus",
    metavar="URL",
    help="Open the Fleet screen (F) on this Prometheus: every host's GPUs and jobs "
    "(default: prometheus_url in the config).",
)
@click.option(
    "--web",
    "web",
    metavar="[HOST:]PORT",
    help="Serve the TUI to a browser instead (loopback unless HOST says otherwise).",
)
@click.option("--web-allow-remote", is_flag=True, help="Allow --web on an address other hosts can reach.")
@click.option("--notice", hidden=True, help="A line for the top of the screen (--web's tabs get it).")
@friendly_errors
def tui(
    db: str | None,
    refresh: float,
    user: str | None,
    prometheus: str | None,
    web: str | None,
    web_allow_remote: bool,
    notice: str | None,
) -> None:
    """Live GPUs, processes and runs in the terminal (or a browser: --web); built for SSH (q quits, ? for keys).

    With no daemon running, it samples in its own process into your database while it is open.
    """
    if not web:
        require_terminal()  # before sampling anything
    cfg = load_config()
    local = LocalSampler.if_no_daemon(cfg, db, start_mode="fleet" if prometheus and not web else "overview")
    notice = NO_DAEMON_NOTICE if local else notice
    try:
        if web:
            if local:
                local.first_tick()
            serve_web(reader_db_path(db), refresh, user, web, web_allow_remote, prometheus, notice)
            return
        from gpuwatch.tui.launch import stale_after_ms

        run_tui(
            reader_db_path(db),
            refresh=refresh,
            user=user,
            start_mode="fleet" if prometheus else "overview",
            prometheus_url=prometheus or cfg.prometheus_url or None,
            prometheus_timeout=cfg.prometheus_timeout,
            notice=notice,
            stale_after_ms=stale_after_ms(cfg, refresh),
            before_run=local and local.first_tick,
        )
    finally:
        if local:
            local.close()


def daemon_answers(cfg: Config) -> bool:
    """True when a gpuwatch daemon (the system's, this user's or the configured one) accepts connections."""
    for path in {paths.default_socket_path(True), paths.default_socket_path(False), cfg.socket_path}:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            try:
                s.connect(str(path))
                return True
            except OSError:
                continue
    return False


class LocalSampler:
    """No daemon: this process samples into the per-user database while the TUI is open (the
    same Sampler as the daemon's and the embedded client's), so a fresh install shows GPUs."""

    def __init__(self, cfg: Config, nvml_module=None):
        from gpuwatch.monitor.sampler import Sampler
        from gpuwatch.store import Writer

        self.writer = Writer(cfg.db_path)
        try:
            self.sampler = Sampler(self.writer, cfg, nvml_module=nvml_module)
        except BaseException:
            self.writer.close()
            raise
        self.sampler.start()

    def first_tick(self) -> None:
        """Wait (at most FIRST_TICK_WAIT_S) until the first samples are stored; called once the
        TUI's own imports are done, so the two overlap."""
        deadline = time.monotonic() + FIRST_TICK_WAIT_S
        while not self.sampler.last_tick_at and time.monotonic() < deadline:
            time.sleep(0.01)
        self.writer.flush(max(0.0, deadline - time.monotonic()))

    @classmethod
    def if_no_daemon(cls, cfg: Config, db: str | None, start_mode: str = "overview") -> "LocalSampler | None":
        """Started when the user named no database, none is being sampled and no daemon answers."""
        if db or cfg.db or start_mode == "fleet" or paths.system_daemon_present() or daemon_answers(cfg):
            return None
        cfg = dataclasses.replace(cfg, system=False)
        if _sampled_lately(str(cfg.db_path)):
            return None
        return cls(cfg)

    def close(self) -> None:
        self.sampler.stop()
        self.writer.close()


def _sampled_lately(db_path: str) -> bool:
    from gpuwatch.store import StoreError, now_ms, open_ro, queries

    try:
        conn = open_ro(db_path)
    except StoreError:
        return False
    try:
        host = queries.latest_host_sample(conn)
        return host is not None and now_ms() - host.ts_ms < FRESH_MS
    except Exception:  # an older or damaged file: the writer says so when it opens it
        return False
    finally:
        conn.close()


def on_a_terminal() -> bool:
    return os.isatty(sys.stdin.fileno()) and os.isatty(sys.stdout.fileno())


def require_terminal() -> None:
    if not on_a_terminal() and not served_to_a_browser():
        raise click.ClickException(
            "gpuwatch tui needs a terminal; for scripts use `gpuwatch status` or `gpuwatch query`"
        )


def served_to_a_browser() -> bool:
    """Whether textual-serve started us (it picks Textual's web driver for its app processes)."""
    return os.environ.get("TEXTUAL_DRIVER", "").endswith(":WebDriver")


def serve_web(
    path: str,
    refresh: float,
    user: str | None,
    address: str,
    allow_remote: bool,
    prometheus: str | None = None,
    notice: str | None = None,
) -> None:
    """Serve the TUI on the database at `path` to browsers at `address`, until Ctrl+C."""
    from gpuwatch.store import open_ro

    try:
        from gpuwatch.tui import web
    except ImportError:
        raise click.ClickException(
            "gpuwatch tui --web needs textual-serve: pip install 'gpuwatch[web]'"
        ) from None
    try:
        host, port = web.parse_address(address)
    except web.WebAddressError as e:
        raise click.ClickException(str(e)) from None
    if not allow_remote and not web.is_loopback(host):
        raise click.ClickException(
            f"--web {address}: {host} is not a loopback address; other hosts could "
            "reach it. Use an SSH tunnel (see docs/tui.md), or add --web-allow-remote"
        )
    open_ro(path).close()  # a wrong path or schema is one clear line, not a page of errors
    try:
        web.TokenServer(web.tui_command(path, refresh, user, prometheus, notice), host, port).serve()
    except OSError as e:
        raise click.ClickException(f"--web {address}: cannot listen there: {e.strerror or e}") from None


def run_tui(path: str, **options: Any) -> None:
    """Open the TUI on the database at `path` (see gpuwatch.tui.launch.run for the options)."""
    from gpuwatch.tui import launch

    require_terminal()
    try:
        code = launch.run(path, **options)
    except launch.LaunchError as e:
        raise click.ClickException(str(e)) from None
    if code:
        sys.exit(code)

"""`gpuwatch daemon`: run the sampler (and the socket/metrics servers) until SIGTERM."""

from __future__ import annotations

import sys

import click

from gpuwatch.cli.options import load_config


@click.command("daemon")
@click.option("--db", type=click.Path(dir_okay=False), help="Database to write.")
@click.option("--interval", type=click.FloatRange(min=0.05), help="GPU sampling interval, seconds.")
@click.option(
    "--system/--user",
    "system",
    default=None,
    help="System paths (/var/lib/gpuwatch, /run/gpuwatch) or per-user ones. "
    "Default: system when run by root or by systemd with a StateDirectory.",
)
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), help="Unix socket for workloads.")
@click.option("--metrics-listen", metavar="HOST:PORT", help="Serve Prometheus /metrics here (default: off).")
def daemon(db, interval, system, socket_path, metrics_listen):
    """Sample GPUs, GPU processes and the host into the database until stopped.

    Logs go to stderr with journald priority prefixes. Under systemd (Type=notify) it reports
    READY, STATUS and the watchdog; SIGTERM stops it cleanly with exit status 0.
    """
    from gpuwatch.daemon import logging as daemon_logging
    from gpuwatch.daemon.main import resolve_mode, run_daemon

    cfg = resolve_mode(
        load_config(
            db=db, interval=interval, system=system, socket=socket_path, metrics_listen=metrics_listen
        )
    )
    daemon_logging.setup()
    sys.exit(run_daemon(cfg))

"""`gpuwatch doctor`: is this host ready for gpuwatch and PyTorch runs? Exits 1 when something is broken."""

from __future__ import annotations

import click

from gpuwatch.cli.options import db_option, friendly_errors, load_config

_MARK = {"ok": ("ok", "green"), "warn": ("WARN", "yellow"), "fail": ("FAIL", "red")}


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Daemon socket to try (default: the system daemon's if present, else yours).",
)
@db_option
@friendly_errors
def doctor_cmd(as_json, socket_path, db):
    """Check the NVIDIA driver, GPUs, torch and CUDA versions, /dev/shm, ptrace for stack
    dumps, the daemon, the database and the systemd service; each problem comes with a fix.

    Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed.
    """
    from pathlib import Path

    from gpuwatch.selftest.doctor import Env, healthy, run_checks
    from gpuwatch.selftest.doctor import as_json as to_json

    cfg = load_config()
    env = Env(
        socket_path=Path(socket_path) if socket_path else None,
        db_path=Path(db) if db else None,
        spool_dir=Path(cfg.spool_dir) if cfg.spool_dir else None,
    )
    checks = run_checks(env)
    if as_json:
        click.echo(to_json(checks))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            label, colour = _MARK[c.status]
            click.echo(f"{click.style(label.ljust(4), fg=colour)}  {c.name.ljust(width)}  {c.detail}")
            if c.fix:
                click.echo(f"      {' ' * width}  fix: {c.fix}")
    if not healthy(checks):
        raise SystemExit(1)

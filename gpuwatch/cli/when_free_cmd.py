"""`gpuwatch notify when-free`: one alert (gpus.free) when `gpuwatch pick`'s rules would give me
the GPUs I want on this host; the wish is then forgotten."""

from __future__ import annotations

import os
import pwd
import socket

import click

from gpuwatch.cli.options import friendly_errors, load_config, pick_rule_options

REACHES = "it reaches your subscriptions that include gpus.free (gpuwatch notify add URL --on gpus.free)"


def ask(gpus: int, min_free_bytes: int, max_util_pct: float = 10.0, window_min: float = 5.0) -> str:
    """Store the wish with the daemon (which owns it to my uid by SO_PEERCRED) or, with no daemon,
    in my own database; the line to tell the user."""
    from gpuwatch.client.link import NoDaemon, daemon_request

    frame = {
        "type": "wish",
        "gpus": gpus,
        "min_free_bytes": min_free_bytes,
        "max_util_pct": max_util_pct,
        "window_min": window_min,
    }
    try:
        reply = daemon_request(load_config(), frame, "when-free")
    except NoDaemon:
        return _ask_embedded(gpus, min_free_bytes, max_util_pct, window_min)
    if reply.get("type") != "wish_added":
        raise click.ClickException(reply.get("error", str(reply)))
    return (
        f"wish {reply['id']} stored: one gpus.free alert when {gpus} GPU(s) of {reply['host']} "
        f"fit, then it is forgotten; {REACHES}"
    )


def _ask_embedded(gpus: int, min_free_bytes: int, max_util_pct: float, window_min: float) -> str:
    from gpuwatch.alerts.host_rules import add_wish
    from gpuwatch.store import now_ms, open_rw

    cfg = load_config()
    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    conn = open_rw(cfg.db_path)
    try:
        with conn:
            wish = add_wish(
                conn,
                uid,
                user,
                socket.gethostname(),
                now_ms(),
                gpus,
                min_free_bytes,
                max_util_pct,
                window_min,
            )
    finally:
        conn.close()
    return (
        f"wish {wish} stored in {cfg.db_path} (no daemon answers): it fires while `gpuwatch "
        f"daemon --user` or a `gpuwatch run` samples this host; {REACHES}"
    )


@click.command("when-free")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(1, 4096),
    default=1,
    show_default=True,
    help="GPUs wanted (on this host).",
)
@pick_rule_options
@friendly_errors
def when_free(count: int, mem: str, max_util: float, window_min: float) -> None:
    """Alert me once (a gpus.free alert, to my subscriptions) when COUNT GPUs of this host fit
    as `gpuwatch pick` judges them: at least --mem free and at most --max-util % busy over the
    last --window minutes, no other user's process. The wish is then forgotten.

    Example: gpuwatch notify when-free -n 2 --mem 40G
    """
    from gpuwatch.analysis.capacity import parse_size

    try:
        mem_bytes = parse_size(mem)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--mem") from None
    click.echo(ask(count, mem_bytes, max_util, window_min))

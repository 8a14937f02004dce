"""`gpuwatch stacks RUN`: the Python stacks of a run's process, now (py-spy) or as stored."""

from __future__ import annotations

import json

import click

from gpuwatch.base import fmt
from gpuwatch.cli.options import db_option, friendly_errors, load_config, reader_db_path
from gpuwatch.cli.profile_cmd import resolve_run


def dump_text(
    run_id: str, pid: int, ts_ms: int, reason: str, stacks_json: str | None, error: str | None
) -> str:
    from collectors.pyspy import format_stacks

    head = f"run {run_id} pid {pid} at {fmt.local_time(ts_ms)} ({reason})"
    if stacks_json is None:
        return f"{head}\nno stacks: {error}"
    return f"{head}\n{format_stacks(json.loads(stacks_json))}"


def _dump_here(db_path: str, run_id: str) -> dict:
    """No daemon: dump with our own ptrace rights and keep the result in the (embedded) database."""
    from gpuwatch.daemon.stalls import dump_row, stepping_pid
    from gpuwatch.store import insert_rows, open_rw

    conn = open_rw(db_path)
    try:
        pid = stepping_pid(conn, run_id)
        if pid is None:
            raise click.ClickException(f"run {run_id} has no process id")
        row = dump_row(run_id, pid, "on_demand")
        with conn:
            insert_rows(conn, "stack_dumps", [row])
    finally:
        conn.close()
    return row


@click.command("stacks")
@click.argument("run")
@click.option("--last", is_flag=True, help="Show the newest stored dump (e.g. a stall's); take none.")
@db_option
@friendly_errors
def stacks_cmd(run, last, db) -> None:
    """Dump the Python stacks of RUN's process with py-spy (through the daemon when one runs,
    else directly) and print them, innermost frame last.

    Example: gpuwatch stacks my-run
    """
    from gpuwatch.store import profiles

    conn, find = resolve_run(db)
    try:
        target = find(run)
        stored = profiles.stack_dumps(conn, target.run_id, limit=1)
    finally:
        conn.close()
    if last:
        if not stored:
            raise click.ClickException(f"run {target.run_id} has no stack dumps")
        d = stored[0]
        click.echo(dump_text(target.run_id, d.pid, d.ts_ms, d.reason, d.stacks_json, d.error))
        return
    if target.status != "running":
        raise click.ClickException(
            f"run {target.run_id} is {target.status}: no process to dump "
            f"(--last shows the newest stored dump)"
        )
    from gpuwatch.client.link import NoDaemon, daemon_request

    try:
        reply = daemon_request(
            load_config(),
            {"type": "control_request", "run_id": target.run_id, "action": "stacks"},
            "stack dumps",
        )
    except NoDaemon:
        reply = {"type": "control_result", **_dump_here(reader_db_path(db), target.run_id)}
    if reply.get("type") != "control_result":
        raise click.ClickException(reply.get("error", str(reply)))
    click.echo(
        dump_text(
            target.run_id,
            reply["pid"],
            reply["ts_ms"],
            "on demand",
            reply.get("stacks_json"),
            reply.get("error"),
        )
    )
    if reply.get("stacks_json") is None:
        raise SystemExit(1)

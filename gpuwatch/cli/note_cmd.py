"""`gpuwatch note RUN TEXT`: a note on a run, by its owner (or root); searchable, shown by `show`."""

from __future__ import annotations

import os
import uuid

import click

from gpuwatch.cli.options import db_option, friendly_errors, load_config, reader_db_path


def _write_here(db_path: str, event: dict) -> dict:
    """A database we may write (our own, or root's anywhere): apply the event as the daemon
    would, with our own uid as the identity, so the same ownership rule holds."""
    import pwd

    from gpuwatch.store import open_rw
    from gpuwatch.store.events import Peer, apply_events_committed

    uid = os.getuid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    conn = open_rw(db_path)
    try:
        return apply_events_committed(conn, [event], Peer(uid, user, os.getpid(), "embedded")).reply()
    finally:
        conn.close()


@click.command("note")
@click.argument("run")
@click.argument("text", nargs=-1, required=True)
@db_option
@friendly_errors
def note_cmd(run, text, db) -> None:
    """Leave a note on RUN (yours; root may note any run). Notes are found by
    `gpuwatch runs --search` and shown by `gpuwatch show`.

    The daemon's database is written by the daemon, which takes who you are from its socket;
    a database you can write (your own) is written directly.

    Example: gpuwatch note gpt-4k "diverged after warmup: lr too high"
    """
    from gpuwatch import protocol
    from gpuwatch.cli.profile_cmd import resolve_run
    from gpuwatch.client.link import daemon_request
    from gpuwatch.store import now_ms

    conn, find = resolve_run(db)
    try:
        target = find(run)
    finally:
        conn.close()
    event = {
        "id": uuid.uuid4().hex,
        "kind": "note",
        "run_id": target.run_id,
        "ts_ms": now_ms(),
        "text": " ".join(text),
    }
    try:
        event = protocol.validate_event(event)[0]
    except protocol.ProtocolError as e:
        raise click.ClickException(str(e)) from None
    db_path = reader_db_path(db)
    if os.access(db_path, os.W_OK):
        reply = _write_here(db_path, event)
    else:
        reply = daemon_request(
            load_config(), {"type": "events", "events": [event]}, "notes on the daemon's runs"
        )
    if reply.get("type") != "ack":
        raise click.ClickException(reply.get("error", str(reply)))
    click.echo(f"noted on run {target.run_id}")

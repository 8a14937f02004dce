"""`gpuwatch alerts`: what fired, when, for whom, and whether it reached your subscriptions."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path


@click.command("alerts")
@db_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("-n", "--limit", type=click.IntRange(min=1), default=50, show_default=True)
@friendly_errors
def alerts_cmd(db: str | None, fmt: str, limit: int) -> None:
    """List recent alerts (yours and the host's; root: everyone's) and their delivery to your
    subscriptions (URLs redacted).

    Example: gpuwatch alerts --format json
    """
    from gpuwatch.alerts.service import backend
    from gpuwatch.alerts.subscriptions import SubscriptionError
    from gpuwatch.base.fmt import clip, local_time
    from gpuwatch.base.unix_socket import user_name
    from gpuwatch.cli.options import load_config
    from gpuwatch.store import alerts as store_alerts
    from gpuwatch.store import open_ro

    conn = open_ro(reader_db_path(db))
    try:
        found = store_alerts.recent(conn, limit, uid=None if os.getuid() == 0 else os.getuid())
    finally:
        conn.close()
    try:
        sent = backend(load_config()).deliveries(os.getuid(), [a.id for a in found if a.id is not None])
        note = None
    except SubscriptionError as e:
        sent, note = {}, f"delivery state unknown: {e}"
    rows: list[dict[str, Any]] = [
        {
            "id": a.id,
            "ts_ms": a.ts_ms,
            "kind": a.kind,
            "host": a.host,
            "uid": a.uid,
            "user": user_name(a.uid) if a.uid is not None else None,
            "run_id": a.run_id,
            "gpu_index": a.gpu_index,
            "pid": a.pid,
            "title": a.title,
            "deliveries": sent.get(str(a.id), []),
        }
        for a in found
    ]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if note:
        click.echo(note, err=True)
    if not rows:
        click.echo("no alerts")
        return
    width = shutil.get_terminal_size((80, 24)).columns
    click.echo(f"{'ID':>5}  {'WHEN':<14}  {'KIND':<18} {'WHOSE':<8} TITLE / DELIVERED TO")
    for r in rows:
        head = f"{r['id']:>5}  {local_time(r['ts_ms'], with_date=True):<14}  {r['kind']:<18} {r['user'] or 'host':<8} "
        click.echo(head + clip(r["title"], max(10, width - len(head) - 1)))
        for d in r["deliveries"]:
            state = d["state"] if d["state"] == "sent" else f"{d['state']} ({d['attempts']} tries)"
            click.echo(f"{'':>7}-> {d['url']} {state}")

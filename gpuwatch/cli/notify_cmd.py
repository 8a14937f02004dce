"""`gpuwatch notify`: subscribe to alerts (add, list, test, remove) and, for a system install,
the notify service itself (serve)."""

from __future__ import annotations

import functools
import os

import click

from gpuwatch.cli.options import load_config
from gpuwatch.cli.when_free_cmd import when_free


def subscription_errors(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        from gpuwatch.alerts.subscriptions import SubscriptionError

        try:
            return f(*args, **kwargs)
        except SubscriptionError as e:
            raise click.ClickException(str(e)) from None

    return wrapper


def describe(sub: dict) -> str:
    who = "admin-wide" if sub["admin"] else f"uid {sub['uid']}"
    scope = (
        f"run {sub['run']}" if sub["run"] else f"run {sub['run_id']} only" if sub["run_id"] else "all runs"
    )
    return f"{sub['id']:>4}  {sub['url']:<34} {','.join(sub['on'])}  ({scope}; {who})"


@click.group("notify")
def notify() -> None:
    """Get alerts (a run's end, failure, OOM, stall; GPUs held idle or lost) on Slack, Discord,
    Teams, Telegram, Matrix, ntfy, e-mail or any webhook, through apprise URLs.

    Example: gpuwatch notify add 'ntfy://ntfy.sh/my-secret-topic'
    """


@notify.command("add")
@click.argument("url")
@click.option(
    "--on",
    "on",
    metavar="KIND,KIND…",
    help="Alert kinds (run.*, run.failed, gpu.idle_held…); default: every run.* kind.",
)
@click.option("--run", "run", metavar="NAME", help="Only the runs of yours with this name.")
@subscription_errors
def add(url: str, on: str | None, run: str | None) -> None:
    """Subscribe URL (an apprise URL) to alerts about your own runs.

    The URL is a secret: it is stored where only you (or the notify service) can read it and
    is shown redacted from now on.

    Example: gpuwatch notify add 'slack://T000/B000/XXXX' --on run.failed,run.oom
    """
    from gpuwatch.alerts.service import backend

    sub = backend(load_config()).add(os.getuid(), url, on=on, run=run)
    click.echo(
        f"subscribed {sub['id']}: {sub['url']} to {', '.join(sub['on'])}{' of run ' + run if run else ''}"
    )


@notify.command("list")
@subscription_errors
def list_cmd() -> None:
    """List your subscriptions (root: everyone's and the admin-wide ones), URLs redacted.

    Example: gpuwatch notify list
    """
    from gpuwatch.alerts.service import backend

    found = backend(load_config()).list_subscriptions(os.getuid())
    if not found:
        click.echo("no subscriptions (add one: gpuwatch notify add URL)")
    for sub in found:
        click.echo(describe(sub))


@notify.command("test")
@click.argument("target", required=False, metavar="[URL|ID]")
@subscription_errors
def test(target: str | None) -> None:
    """Send a test message to URL, to subscription ID, or to each of your subscriptions.

    Example: gpuwatch notify test 'json://127.0.0.1:8080/hook'
    """
    from gpuwatch.alerts.deliver import check_url, send
    from gpuwatch.alerts.redact import redact
    from gpuwatch.alerts.service import TEST_TITLE, backend, test_body

    if target and not target.isdigit():
        check_url(target)
        results = [{"url": redact(target), "error": send(target, TEST_TITLE, test_body(os.uname().nodename))}]
    else:
        results = backend(load_config()).test(os.getuid(), int(target) if target else None)
        if not results:
            raise click.ClickException("no subscriptions to test (add one: gpuwatch notify add URL)")
    for r in results:
        click.echo(f"{r['url']}: {'sent' if r['error'] is None else 'FAILED: ' + r['error']}")
    if any(r["error"] for r in results):
        raise SystemExit(1)


@notify.command("remove")
@click.argument("sub_id", type=int, metavar="ID")
@subscription_errors
def remove(sub_id: int) -> None:
    """Remove your subscription ID (see `gpuwatch notify list`).

    Example: gpuwatch notify remove 3
    """
    from gpuwatch.alerts.service import backend

    sub = backend(load_config()).remove(os.getuid(), sub_id)
    click.echo(f"removed {sub['id']}: {sub['url']}")


@notify.command("serve")
@click.option("--db", type=click.Path(dir_okay=False), help="The shared database to read alerts from.")
@click.option(
    "--system/--user",
    "system",
    default=None,
    help="System paths (the gpuwatch-notify unit) or per-user ones.",
)
@subscription_errors
def serve(db: str | None, system: bool | None) -> None:
    """Deliver alerts and take subscriptions on the notify socket until SIGTERM: what
    systemd/gpuwatch-notify.service runs. Not needed with `gpuwatch daemon --user`, which
    delivers by itself.

    Example: gpuwatch notify serve --system
    """
    import signal
    import threading

    from gpuwatch.alerts.server import NotifyService
    from gpuwatch.daemon import logging as daemon_logging
    from gpuwatch.daemon.main import resolve_mode

    cfg = resolve_mode(load_config(db=db, system=system))
    daemon_logging.setup()
    service = NotifyService(cfg)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    service.start()
    try:
        while not stop.wait(3600):
            pass
    finally:
        service.stop()


notify.add_command(when_free)

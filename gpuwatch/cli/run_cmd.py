"""`gpuwatch run -- CMD ARGS...`: run a command as a tracked run, whether or not it is instrumented."""

from __future__ import annotations

import gc
import os
from typing import TYPE_CHECKING

import click

from gpuwatch.cli.options import friendly_errors, load_config
from gpuwatch.cli.our_lines import prefix_our_log_lines

if TYPE_CHECKING:
    from gpuwatch.client.supervise import ChildIngest


def default_name(command: tuple[str, ...]) -> str:
    """`python train.py --lr 1` -> 'train.py'; `torchrun ... x.py` -> 'x.py'; else the program."""
    scripts = [os.path.basename(a) for a in command[1:] if a.endswith(".py")]
    if scripts:
        return scripts[0]
    if os.path.basename(command[0]).startswith("python") and "-m" in command[:-1]:
        return command[command.index("-m") + 1]
    return os.path.basename(command[0])


def _notify_url(value: str) -> str:
    """A --notify value: the URL, or env:NAME for one kept in an environment variable (a command
    line is visible to every user's `ps`; an environment is not)."""
    from gpuwatch.alerts.deliver import check_url
    from gpuwatch.alerts.subscriptions import SubscriptionError

    url = os.environ.get(value[4:], "") if value.startswith("env:") else value
    if value.startswith("env:") and not url:
        raise click.ClickException(f"--notify {value}: the environment variable {value[4:]} is not set")
    try:
        check_url(url)
    except SubscriptionError as e:
        raise click.ClickException(f"--notify: {e}") from None
    return url


def _private_ingest() -> ChildIngest:
    """What serves the child's events when no daemon does; imported only then, once the child
    is started (it loads asyncio, the store and the daemon's ingest: 0.05-0.1 s)."""
    from gpuwatch.cli.private_ingest import PrivateIngest

    return PrivateIngest


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--name", help="Run name shown by `gpuwatch runs` (default: the script or program).")
@click.option(
    "--pick",
    "pick_n",
    type=click.IntRange(min=1),
    metavar="N",
    help="Run on the N best free GPUs of this host (as `gpuwatch pick -n N`).",
)
@click.option(
    "--no-instrument", is_flag=True, help="Do not hook torch in the command (also: GPUWATCH_INSTRUMENT=0)."
)
@click.option(
    "--notify",
    "notify",
    multiple=True,
    metavar="URL",
    help="Send this run's alerts (its end, failure, OOM, stall) to an apprise URL, or "
    "env:NAME for a URL in that environment variable (kept out of `ps`); works with "
    "no daemon. Repeatable.",
)
@click.option(
    "--tensorboard",
    metavar="DIR|auto",
    help="Mirror the run's figures live into TensorBoard files under DIR/gpuwatch/; "
    "'auto': beside the TensorBoard logs the program writes itself.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@friendly_errors
def run_cmd(
    name: str | None,
    pick_n: int | None,
    no_instrument: bool,
    notify: tuple[str, ...],
    tensorboard: str | None,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND as a tracked run and exit with its status.

    The run records the command, exit code or signal and duration; the daemon links the
    command's processes (and their GPU memory) to it. A PyTorch program needs no change: when
    it imports torch, gpuwatch hooks its optimiser steps and its model's forward and records
    steps, tokens/s, loss, memory and OOM postmortems (torchrun: one run per rank). A child
    that calls gpuwatch.track() itself is counted by its own calls instead. SIGINT and SIGTERM
    are passed on to the command.

    Example: gpuwatch run --name sweep-3 --notify 'ntfy://ntfy.sh/my-topic' -- python train.py
    """
    if notify:
        notify = tuple(_notify_url(value) for value in notify)
    gpu_env = {}
    if pick_n:
        from gpuwatch.cli.pick_cmd import visible_devices

        gpu_env["CUDA_VISIBLE_DEVICES"] = visible_devices(pick_n)
    from gpuwatch.client.supervise import CannotRun, supervise
    from gpuwatch.integrations import child_path

    cfg = load_config()
    prefix_our_log_lines()
    try:
        code = supervise(
            cfg,
            command,
            name or default_name(command),
            _private_ingest,
            child_path.prepare,
            gpu_env,
            instrument=not no_instrument,
            notify=notify,
            tensorboard=tensorboard,
        )
    except CannotRun as e:
        raise click.ClickException(str(e)) from None
    # Our exit follows the program's, and all that is left is tearing down the modules we loaded:
    # their objects are left out of the interpreter's last collections (the OS frees them), which
    # took 20-30 ms after every program's end.
    gc.freeze()
    raise SystemExit(code)

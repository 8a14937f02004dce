"""`gpuwatch run -- CMD ARGS...`: run a command as a tracked run, whether or not it is instrumented."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import tempfile
import time
from pathlib import Path

import click

from gpuwatch.base import priority
from gpuwatch.cli.options import friendly_errors, load_config
from gpuwatch.cli.our_lines import prefix_our_log_lines

FORWARDED = {signal.SIGINT, signal.SIGTERM}
SI_KERNEL = 0x80  # si_code of a signal the kernel raised, e.g. Ctrl-C from the terminal


def _end_state(run_id: str) -> dict:
    """What an instrumented child said about its end (OOM, exception), if it said anything."""
    from gpuwatch.client.run import end_state_path

    path = end_state_path(run_id)
    try:
        state = json.loads(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _bootstrap_note(path: Path) -> str | None:
    """The line a Python child's bootstrap left when it could not instrument that interpreter."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _wait_forwarding(pid: int) -> int:
    """Wait for the child; pass it SIGINT/SIGTERM sent to us. Returns its wait status.

    A Ctrl-C from the terminal already reached the child (same process group), so a SIGINT the
    kernel raised is not passed on again: the child sees each interrupt once.
    """
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        info = signal.sigtimedwait(FORWARDED | {signal.SIGCHLD}, 1.0)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGINT and info.si_code == SI_KERNEL:
            continue
        try:
            os.kill(pid, info.si_signo)
        except ProcessLookupError:
            pass


def _yield_cpu(increment: int = 10) -> None:
    """Lower the CPU priority of this process's threads (the transport's and, with no daemon, the
    sampler's and the child's ingest) once the program is spawned at the priority it was given:
    on a saturated host the training gets the CPU before its bookkeeping. Linux keeps a nice value
    per thread, so each is lowered; threads started later inherit it."""
    lowered: set[int] = set()
    while True:  # again while a thread not yet lowered started one (which took its priority)
        try:
            threads = {int(tid) for tid in os.listdir("/proc/self/task")} - lowered
        except OSError:  # no /proc: this thread alone
            threads = {0} - lowered
        if not threads:
            return
        for tid in threads:
            priority.lower_thread(increment, tid)
        lowered |= threads


def _wait_for_mirror(mirror, timeout_s: float = 30.0) -> None:
    """Let the TensorBoard mirror write the ended run's last figures before we exit; past the
    timeout it finishes on its own (it watches our pid)."""
    import subprocess

    try:
        mirror.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


def default_name(command: tuple[str, ...]) -> str:
    """`python train.py --lr 1` -> 'train.py'; `torchrun ... x.py` -> 'x.py'; else the program."""
    scripts = [os.path.basename(a) for a in command[1:] if a.endswith(".py")]
    if scripts:
        return scripts[0]
    if os.path.basename(command[0]).startswith("python") and "-m" in command[:-1]:
        return command[command.index("-m") + 1]
    return os.path.basename(command[0])


def _kill_cause(pid: int, signum: int, oom_kills_before: int | None) -> dict:
    """Error fields naming the kernel OOM killer when the evidence says it sent the SIGKILL:
    the kernel log names the pid, or our cgroup's oom_kill count rose while the child ran."""
    from collectors.host import cgroup_oom_kills
    from collectors.kmsg import oom_killed

    if signum != signal.SIGKILL:
        return {}
    line = oom_killed({pid}).get(pid)
    if line:
        return {"error_type": "OOMKilled", "error_message": f"killed by the kernel OOM killer: {line}"}
    after = cgroup_oom_kills()
    if oom_kills_before is not None and after is not None and after > oom_kills_before:
        return {
            "error_type": "OOMKilled",
            "error_message": "killed by the kernel OOM killer (this cgroup's "
            f"memory.events oom_kill went from {oom_kills_before} to {after} while it ran)",
        }
    return {}


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


def _subscribe(cfg, urls: tuple[str, ...], run_id: str) -> bool:
    """Each --notify URL becomes a subscription to this run's alerts alone. True when they (or
    saved ones) live in the user's private store, which this wrapper delivers from when no
    daemon does; a notify service delivers its own."""
    from gpuwatch.alerts.service import Local
    from gpuwatch.alerts.subscriptions import SubscriptionError
    from gpuwatch.cli.notify_cmd import backend

    try:
        where = backend(cfg)
        for url in urls:
            where.add(os.getuid(), url, run_id=run_id, transient=True)
        return isinstance(where, Local) and (
            bool(urls) or (where.store_path.exists() and bool(where.list_subscriptions(os.getuid())))
        )
    except SubscriptionError as e:  # the run matters more than its alerts: say so and go on
        click.echo(f"gpuwatch: this run's alerts will not be sent: {e}", err=True)
        return False


def _deliver(cfg, db_path, run_id: str) -> None:
    """Deliver this run's alerts (and the user's other pending ones) unless a user daemon does."""
    from gpuwatch.alerts.run_delivery import deliver_after_run

    left = deliver_after_run(
        cfg.notify_db_path,
        db_path,
        run_id,
        cfg.notify_group_seconds,
        terminals_uid=os.getuid() if cfg.notify_terminals else None,
    )
    if left:
        click.echo(
            f"gpuwatch: {left} alert message(s) not delivered yet (endpoint down?); they stay "
            "queued for the next `gpuwatch run` or `gpuwatch daemon --user`",
            err=True,
        )


def wrap(
    command: tuple[str, ...],
    name: str | None,
    gpu_env: dict[str, str] | None = None,
    instrument: bool = True,
    notify: tuple[str, ...] = (),
    tensorboard: str | None = None,
) -> int:
    """Run `command` as a run of its own; return the exit code the wrapper should exit with.
    `gpu_env` is added to the command's environment (CUDA_VISIBLE_DEVICES from --pick); with
    `instrument`, a Python child gets the bootstrap that hooks torch when it imports it; each
    `notify` URL gets this run's alerts (delivered by the wrapper when no daemon runs); with
    `tensorboard` (a directory or "auto"), a process beside it mirrors the run's figures there."""
    from gpuwatch.base.clock import elapsed_end_ms
    from gpuwatch.cli import child_path
    from gpuwatch.client import metadata
    from gpuwatch.client.run import ENV_RUN_ID, ENV_RUN_NAME, new_run_id
    from gpuwatch.client.transport import EmbeddedTransport, connect, daemon_answers
    from gpuwatch.store import now_ms

    cfg = load_config()
    prefix_our_log_lines()
    name = name or default_name(command)
    gpu_env = gpu_env or {}
    # Block before any thread starts (the transport's threads inherit the mask), so every
    # SIGINT/SIGTERM comes to sigtimedwait below instead of interrupting us.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED | {signal.SIGCHLD})
    transport = ingest = listening = mirror = None
    deliver_here = False
    # Short, private and ours alone: the child's import directory, its note, and (with no
    # daemon) the socket this process serves it on (Unix socket paths are capped at 107 bytes).
    private = Path(tempfile.mkdtemp(prefix="gpuwatch-run-"))
    note = private / "note"
    run_id = new_run_id()
    ids = iter(f"wrap-{os.getpid()}-{n}" for n in range(1 << 30))

    started = (now_ms(), time.monotonic())

    def send(kind: str, **fields) -> None:
        # The run starts when we do (run_start may be sent after the spawn); its end is timed
        # from then on the monotonic clock if the wall clock stepped.
        if kind == "run_start":
            ts = started[0]
        elif kind == "run_end":
            ts = elapsed_end_ms(*started, now_ms(), time.monotonic())
        else:
            ts = now_ms()
        transport.send({"id": next(ids), "kind": kind, "run_id": run_id, "ts_ms": ts, **fields})

    def begin(embedded: bool) -> None:
        """The run's transport, and its run_start: through the daemon, stored before the child
        can add steps to the run; or into the database this process writes itself, whose writer
        stores it before any event of the child's."""
        nonlocal transport
        transport = EmbeddedTransport(cfg) if embedded else connect(cfg)
        fields = metadata.collect(dict(os.environ, **gpu_env))
        fields["command"] = shlex.join(command)
        send("run_start", name=name, **fields)
        if not embedded:
            transport.flush()

    try:
        env = dict(os.environ, **{ENV_RUN_ID: run_id, ENV_RUN_NAME: name}, **gpu_env)
        if daemon_answers(cfg):
            begin(embedded=False)
        else:
            # This process serves the child's events. Its socket listens from now on, and is
            # served once the run is stored, after the spawn: the program starts while we open
            # the database and set up the sampler, not after.
            from gpuwatch.cli.private_ingest import PrivateIngest

            listening = PrivateIngest.listen(private / "sock")
            env["GPUWATCH_SOCKET"] = str(private / "sock")
        if instrument:
            path = child_path.make(private / "path")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), env.get("PYTHONPATH")) if p)
            env[child_path.ENV_NOTE] = str(note)
        else:
            from gpuwatch.integrations.autohook import ENV_INSTRUMENT

            env[ENV_INSTRUMENT] = "0"
        try:
            pid = os.posix_spawnp(command[0], list(command), env, setsigmask=(), setsigdef=tuple(FORWARDED))
        except OSError as e:
            if transport is None:
                begin(embedded=True)
            send(
                "run_end",
                status="failed",
                exit_code=127,
                error_type=type(e).__name__,
                error_message=f"cannot run {command[0]}: {e.strerror}",
            )
            raise click.ClickException(f"cannot run {command[0]!r}: {e.strerror}") from None
        from collectors.host import cgroup_oom_kills

        oom_kills_before = cgroup_oom_kills()
        if transport is None:
            begin(embedded=True)
            ingest = PrivateIngest(cfg, transport.writer, private / "sock", listening)
        deliver_here = _subscribe(cfg, notify, run_id)
        if tensorboard:
            from gpuwatch.client.tensorboard import start_mirror

            mirror = start_mirror(
                tensorboard, since_ms=started[0], watch_pid=os.getpid(), wrapper_run_id=run_id
            )
        _yield_cpu()
        status = os.waitstatus_to_exitcode(_wait_forwarding(pid))
        state = _end_state(run_id)
        why = _bootstrap_note(note)
        if why:
            send(
                "run_event",
                seq=time.time_ns() // 1000,
                event_kind="not_instrumented",
                payload={"reason": why},
            )
        if status < 0:
            send("run_end", status="killed", signal=-status, **_kill_cause(pid, -status, oom_kills_before))
            return 128 - status
        if status == 0:
            send("run_end", status="finished", exit_code=0)
        else:
            send(
                "run_end",
                status=state.get("status")
                if state.get("status") in ("failed", "oom", "killed")
                else "failed",
                exit_code=status,
                error_type=state.get("error_type"),
                error_message=state.get("error_message"),
                signal=state.get("signal"),
            )
        return status
    finally:
        if ingest is not None:
            ingest.close()
        elif listening is not None:
            listening.close()
        if transport is not None:
            transport.close()
        if mirror is not None:
            _wait_for_mirror(mirror)
        shutil.rmtree(private, ignore_errors=True)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if deliver_here and transport is not None:
            from gpuwatch.cli.options import reader_db_path

            # The database the run's alerts are in: ours with no daemon, else the daemon's.
            _deliver(cfg, cfg.db_path if transport.mode == "embedded" else reader_db_path(None), run_id)


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
    raise SystemExit(
        wrap(command, name, gpu_env, instrument=not no_instrument, notify=notify, tensorboard=tensorboard)
    )

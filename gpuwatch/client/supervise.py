"""Run a command as a run of its own: what `gpuwatch run` does once its options are read.

The supervisor spawns the command (a Python child with the bootstrap on its import path),
records the run's start and end (exit code, signal, OOM kill, the child's own account of an
exception), passes SIGINT/SIGTERM on, samples GPUs and host itself when no daemon does, and
delivers the run's alerts when nothing else will.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from gpuwatch.base import paths, priority
from gpuwatch.base.config import Config

if TYPE_CHECKING:
    from gpuwatch.store import Writer

FORWARDED = {signal.SIGINT, signal.SIGTERM}
SI_KERNEL = 0x80  # si_code of a signal the kernel raised, e.g. Ctrl-C from the terminal


class CannotRun(Exception):
    """The command could not be started; the message is one line."""


class Served(Protocol):
    def close(self) -> None: ...


class ChildIngest(Protocol):
    """Serves the child's events with no daemon: gpuwatch.cli.private_ingest.PrivateIngest, the
    daemon's own ingest code, which the client may not import. It serves the socket `listening`,
    bound at `path` before the child started (the child may connect from its first instant)."""

    def __call__(self, cfg: Config, writer: Writer, path: Path, listening: socket.socket) -> Served: ...


def _end_state(run_id: str) -> dict[str, Any]:
    """What an instrumented child said about its end (OOM, exception), if it said anything."""
    from gpuwatch.client.attach import end_state_path

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


def _wait_for_mirror(mirror: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Let the TensorBoard mirror write the ended run's last figures before we exit; past the
    timeout it finishes on its own (it watches our pid)."""
    try:
        mirror.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass


def _kill_cause(pid: int, signum: int, oom_kills_before: int | None) -> dict[str, str]:
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


def _say(line: str) -> None:
    # The program's stderr is ours too: our lines say they are ours.
    print(f"gpuwatch: {line}", file=sys.stderr, flush=True)


def _subscribe(cfg: Config, urls: tuple[str, ...], run_id: str) -> bool:
    """Each --notify URL becomes a subscription to this run's alerts alone. True when they (or
    saved ones) live in the user's private store, which this wrapper delivers from when no
    daemon does; a notify service delivers its own."""
    if not urls and not cfg.notify_db_path.exists():
        return False  # no subscription anywhere of ours (the alerts' modules stay unloaded)
    from gpuwatch.alerts.service import Local, backend
    from gpuwatch.alerts.subscriptions import SubscriptionError

    try:
        where = backend(cfg)
        for url in urls:
            where.add(os.getuid(), url, run_id=run_id, transient=True)
        return isinstance(where, Local) and (
            bool(urls) or (where.store_path.exists() and bool(where.list_subscriptions(os.getuid())))
        )
    except SubscriptionError as e:  # the run matters more than its alerts: say so and go on
        _say(f"this run's alerts will not be sent: {e}")
        return False


def _deliver(cfg: Config, db_path: Path, run_id: str) -> None:
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
        _say(
            f"{left} alert message(s) not delivered yet (endpoint down?); they stay "
            "queued for the next `gpuwatch run` or `gpuwatch daemon --user`"
        )


def supervise(
    cfg: Config,
    command: tuple[str, ...],
    name: str,
    child_ingest: Callable[[], ChildIngest],
    prepare_child: Callable[[dict[str, str], Path, Path, bool], None],
    gpu_env: dict[str, str] | None = None,
    instrument: bool = True,
    notify: tuple[str, ...] = (),
    tensorboard: str | None = None,
) -> int:
    """Run `command` as the run `name`; return the exit code to exit with (128+N for signal N).
    `gpu_env` is added to the command's environment (CUDA_VISIBLE_DEVICES from --pick); with
    `instrument`, a Python child gets the bootstrap that hooks torch when it imports it; each
    `notify` URL (checked) gets this run's alerts, delivered from here when no daemon runs; with
    `tensorboard` (a directory or "auto"), a process beside it mirrors the run's figures there.
    With no daemon, `child_ingest()` (called only then, once the child is started: its import
    is heavy) serves the child's events. `prepare_child(env, private_dir, note_path, instrument)`
    readies the child's environment (gpuwatch.integrations.child_path.prepare: the bootstrap is
    the integrations' part, above the client). Raises CannotRun.

    Before the spawn this imports only what the spawn needs: the program starts while the
    database, the ingest and the sampler are set up, not after."""
    from gpuwatch.client import metadata

    head = metadata.GitHead(os.getcwd())  # git runs while the rest gets ready for the spawn
    from gpuwatch.base.clock import elapsed_end_ms, now_ms
    from gpuwatch.base.unix_socket import bind_socket
    from gpuwatch.client.attach import ENV_RUN_ID, ENV_RUN_NAME, new_run_id
    from gpuwatch.client.transport import EmbeddedTransport, Transport, connect, daemon_answers

    gpu_env = gpu_env or {}
    # Block before any thread starts (the transport's threads inherit the mask), so every
    # SIGINT/SIGTERM comes to sigtimedwait below instead of interrupting us.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED | {signal.SIGCHLD})
    transport: Transport | None = None
    ingest: Served | None = None
    listening: socket.socket | None = None
    local: EmbeddedTransport | None = None  # ours, with no daemon: its sampler starts late
    mirror: subprocess.Popen[bytes] | None = None
    deliver_here = False
    # Short, private and ours alone: the child's import directory, its note, and (with no
    # daemon) the socket this process serves it on (Unix socket paths are capped at 107 bytes).
    private = Path(tempfile.mkdtemp(prefix="gpuwatch-run-"))
    note = private / "note"
    run_id = new_run_id()
    ids = iter(f"wrap-{os.getpid()}-{n}" for n in range(1 << 30))

    started = (now_ms(), time.monotonic())

    def send(kind: str, **fields: Any) -> None:
        # The run starts when we do (run_start may be sent after the spawn); its end is timed
        # from then on the monotonic clock if the wall clock stepped.
        if kind == "run_start":
            ts = started[0]
        elif kind == "run_end":
            ts = elapsed_end_ms(*started, now_ms(), time.monotonic())
        else:
            ts = now_ms()
        assert transport is not None  # begin() came first
        transport.send({"id": next(ids), "kind": kind, "run_id": run_id, "ts_ms": ts, **fields})

    def begin(chosen: Transport, embedded: bool, env: dict[str, str]) -> None:
        """The run's transport, and its run_start (which describes the command's environment
        `env`): through the daemon, stored before the child can add steps to the run; or into
        the database this process writes itself, whose writer stores it before any event of the
        child's."""
        nonlocal transport
        transport = chosen
        fields = metadata.collect(env)
        fields["command"] = shlex.join(command)
        send("run_start", name=name, **fields)
        if not embedded:
            transport.flush()

    try:
        env = dict(os.environ, **{ENV_RUN_ID: run_id, ENV_RUN_NAME: name}, **gpu_env)
        env[metadata.ENV_GIT_HEAD] = head.env_value()
        if daemon_answers(cfg):
            begin(connect(cfg), embedded=False, env=env)
        else:
            # This process serves the child's events. Its socket listens from now on (this user
            # only), and is served once the run is stored, after the spawn.
            listening = bind_socket(private / "sock", 0o600)
            env["GPUWATCH_SOCKET"] = str(private / "sock")
        prepare_child(env, private, note, instrument)
        try:
            pid = os.posix_spawnp(command[0], list(command), env, setsigmask=(), setsigdef=tuple(FORWARDED))
        except OSError as e:
            if transport is None:
                begin(EmbeddedTransport(cfg), embedded=True, env=env)
            send(
                "run_end",
                status="failed",
                exit_code=127,
                error_type=type(e).__name__,
                error_message=f"cannot run {command[0]}: {e.strerror}",
            )
            raise CannotRun(f"cannot run {command[0]!r}: {e.strerror}") from None
        from collectors.host import cgroup_oom_kills

        oom_kills_before = cgroup_oom_kills()
        if listening is not None:
            local = EmbeddedTransport(cfg, sample_now=False)
            begin(local, embedded=True, env=env)
            ingest = child_ingest()(cfg, local.writer, private / "sock", listening)
        deliver_here = _subscribe(cfg, notify, run_id)
        if tensorboard:
            from gpuwatch.client.tensorboard import start_mirror

            mirror = start_mirror(
                tensorboard, since_ms=started[0], watch_pid=os.getpid(), wrapper_run_id=run_id
            )
        _yield_cpu()
        if local is not None:
            local.start_sampler()  # at the lower priority: its set-up yields to the program's start
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
            # The database the run's alerts are in: ours with no daemon, else the daemon's.
            _deliver(
                cfg, cfg.db_path if transport.mode == "embedded" else paths.reader_db_path(cfg.db), run_id
            )

"""The processes that do a training process's bookkeeping beside it, at low priority.

Nothing heavy runs inside the training process, where it would compete with training for the
GIL and the CPU:
- with no daemon, `python -m gpuwatch.cli.private_ingest` holds the database writer and the
  GPU/host/process sampler, and this process's runs send to its socket as they would to a
  daemon (`connect`): the recorder, one per process, started by the first run;
- each profile window's trace is read by `python -m gpuwatch.client.trace_worker`.
Both lower their own priority by NICE first, so on a busy host the training gets the CPU first.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch.base.config import Config

if TYPE_CHECKING:
    from gpuwatch.client.transport import Transport

log = logging.getLogger(__name__)

NICE = 10
PARENT_CHECK_S = 1.0  # how soon a helper notices its parent is gone when a pipe cannot tell it
STOP_TIMEOUT_S = 10.0

_lock = threading.Lock()
_recorder: tuple[Path, Path, subprocess.Popen[bytes]] | None = None  # (database, socket, process)


def lower_priority() -> None:
    """In a helper, first thing: nice +NICE over the process that started it (Linux keeps a nice
    value per thread; every thread started afterwards inherits it)."""
    try:
        os.nice(NICE)
    except OSError:  # no permission to change it: run as we are
        pass


def command(module: str, *args: object) -> list[str]:
    return [sys.executable, "-m", module, *map(str, args)]


def environment() -> dict[str, str]:
    """This process's environment, with the import path that found gpuwatch here."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def wait_for_parent_exit() -> None:
    """In a helper: return once the process that started it has gone. Its end of our stdin
    closes when it exits, even by SIGKILL; a child it forked (a DataLoader worker) may still
    hold the pipe, so being handed to another parent counts too."""
    parent = os.getppid()
    while os.getppid() == parent:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], PARENT_CHECK_S)
        if readable and not os.read(sys.stdin.fileno(), 1 << 16):
            return


class RecorderFailed(RuntimeError):
    pass


def connect(cfg: Config) -> Transport:
    """The transport for a run of this process: the daemon's (or the `gpuwatch run` wrapper's)
    when one answers, else the recorder helper's, started on first use. If the helper cannot
    start, the run records from inside this process (EmbeddedTransport), with one warning."""
    from gpuwatch.client.transport import DaemonTransport, _daemon_link
    from gpuwatch.client.transport import connect as connect_to

    found = _daemon_link(cfg)  # one greeting: the link that answered is the run's
    if found is not None:
        return DaemonTransport(cfg, *found)
    try:
        path = recorder_socket(cfg)
    except (OSError, RecorderFailed) as e:
        log.warning("gpuwatch: %s; recording from inside this process instead", e)
        return connect_to(cfg)
    return connect_to(dataclasses.replace(cfg, socket=str(path)))


def recorder_socket(cfg: Config) -> Path:
    """The socket of this process's recorder for cfg's database, starting it if need be."""
    global _recorder
    with _lock:
        if _recorder is not None:
            db, path, process = _recorder
            if db == cfg.db_path and process.poll() is None:
                return path
            _recorder = None
            _stop(process)  # a recorder for another database (the configuration changed)
        path = Path(tempfile.mkdtemp(prefix="gpuwatch-rec-")) / "sock"
        # Its own session: a Ctrl-C meant for the training process must not stop it first. It
        # reads the same configuration from the environment it inherits.
        process = subprocess.Popen(
            command("gpuwatch.cli.private_ingest", path),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=environment(),
        )
        assert process.stdout is not None  # stdout=PIPE
        if process.stdout.readline().strip() != b"ready":
            process.wait()
            raise RecorderFailed(
                f"the helper process that records this process's runs did not start "
                f"(exit status {process.returncode})"
            )
        process.stdout.close()
        _recorder = (cfg.db_path, path, process)  # its stdin stays open; it closes when we exit
        return path


def recorder_pid() -> int | None:
    """The recorder helper's pid while it runs, else None."""
    recorder = _recorder
    return recorder[2].pid if recorder is not None and recorder[2].poll() is None else None


def stop_recorder() -> None:
    """Stop the recorder helper, if it runs, once it recorded what it was sent: before its
    database goes away (a benchmark's temporary directory), not at this process's exit."""
    global _recorder
    with _lock:
        recorder, _recorder = _recorder, None
    if recorder is not None:
        _stop(recorder[2])


def _stop(process: subprocess.Popen[bytes]) -> None:
    try:
        if process.stdin is not None:
            process.stdin.close()
        process.wait(STOP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        process.kill()
        process.wait()

"""gpuwatch.autolog() and `%load_ext gpuwatch`: the zero-code hooks of `gpuwatch run`, switched
on inside an interpreter nothing wraps (a Jupyter kernel, a program someone else launched).

When a run ends (docs/tracking.md, "Notebooks and programs you did not launch"):
- the interpreter exits (a kernel shut down or restarted): the run finishes;
- autolog() is called again (or `%unload_ext gpuwatch`): the current run finishes, and the
  next training step starts a new one, under the new name;
- no training step for `idle_timeout` seconds: the run finishes, and the next training step
  starts a new one under the same name.
A new run finds its model afresh, so a notebook that builds a new model in a later cell gets
it measured.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from gpuwatch.base import config as config_mod
from gpuwatch.base import threads
from gpuwatch.client import helpers
from gpuwatch.client.transport import daemon_answers
from gpuwatch.integrations import autohook

DEFAULT_IDLE_TIMEOUT_S = 600.0

_lock = threading.Lock()
_watch: "_IdleWatch | None" = None
_mirrors: list = []  # the TensorBoard mirror of this process's runs, once asked for


def autolog(
    name: str | None = None,
    idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT_S,
    tensorboard: str | None = None,
) -> None:
    """Record this interpreter's training as gpuwatch runs, with no other change to the code.

    name: the runs' name (default: the notebook's file name under Jupyter, else "notebook" in a
    kernel, else the script's).
    idle_timeout: seconds without a training step after which the run ends (None: never).
    tensorboard: a log directory: this process's runs are mirrored live into TensorBoard files
    under DIR/gpuwatch/ by a process beside this one; "auto": beside the TensorBoard logs the
    program writes itself.
    Imports torch if the program has not yet.
    """
    global _watch
    import torch

    with _lock:
        _end_current()
        cfg = config_mod.load()
        if not daemon_answers(cfg):
            # The recorder helper (writer and sampler, beside this process) starts now, while
            # the user waits for this call, rather than at the first training step.
            try:
                helpers.recorder_socket(cfg)
            except (OSError, helpers.RecorderFailed):
                pass  # the first run says so, and records from inside this process
        hooks = autohook.install(torch)
        hooks.name = name or _default_name()
        if tensorboard and not _mirrors:
            from gpuwatch.client.tensorboard import start_mirror

            _mirrors.append(
                start_mirror(
                    tensorboard, since_ms=time.time_ns() // 1_000_000, watch_pid=os.getpid(), pid=os.getpid()
                )
            )
        if idle_timeout is not None:
            _watch = _IdleWatch(float(idle_timeout), hooks.name)


def stop() -> None:
    """End the current run and remove the hooks (what `%unload_ext gpuwatch` does)."""
    with _lock:
        _end_current()


def _end_current() -> None:
    global _watch
    if _watch is not None:
        _watch.cancel()
        _watch = None
    hooks = autohook.uninstall()
    if hooks is not None and hooks.run is not None:
        hooks.run.finish()


def _default_name() -> str | None:
    session = os.environ.get("JPY_SESSION_NAME")  # jupyter_server gives a kernel its notebook's path
    if session:
        return os.path.basename(session)
    if "ipykernel" in sys.modules:
        return "notebook"
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return os.path.basename(main) if main else None


class _IdleWatch:
    """Ends the current run once no step came for `timeout` s, and re-arms the hooks afresh."""

    def __init__(self, timeout: float, name: str | None):
        self.timeout = timeout
        self.name = name
        self._cancelled = threading.Event()
        self._thread = threads.start(
            threading.Thread(target=self._watch, name="gpuwatch-autolog-idle", daemon=True)
        )

    def cancel(self) -> None:
        self._cancelled.set()

    def _watch(self) -> None:
        last_count, last_change = -1, time.monotonic()
        # A check a few times per timeout: the training thread hardly ever sees this one.
        while not self._cancelled.wait(min(self.timeout / 4, 30.0)):
            hooks = autohook.active()
            run = hooks.run if hooks is not None else None
            if run is None:
                last_count, last_change = -1, time.monotonic()
                continue
            if run.steps_recorded != last_count:
                last_count, last_change = run.steps_recorded, time.monotonic()
            elif time.monotonic() - last_change >= self.timeout:
                with _lock:
                    if self._cancelled.is_set() or autohook.active() is not hooks:
                        return
                    autohook.uninstall()
                    run.finish()
                    import torch

                    autohook.install(torch).name = self.name

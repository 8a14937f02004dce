"""Profiler windows driven by Run.step(): scheduled from the config, or asked for by the daemon.

Run.step() checks one attribute (`active`) and calls step() only while something is profiling
or waiting to: an idle hook costs the training loop a bool test (bench/bench_profiler.py).
Each finished window becomes one `profile` event (top operators, and the trace's breakdown
from gpuwatch.analysis.trace) and a gzipped Chrome trace under <runs_path>/<run_id>/profiles/.
The breakdown is worked out by a low-priority process of its own (gpuwatch.client.trace_worker)
that a thread here waits for: the training step neither waits for it nor shares its GIL.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from collectors import torch_profiler
from gpuwatch.base.clock import now_ms
from gpuwatch.base.config import Config
from gpuwatch.base.diskfull import FullDisk, no_space
from gpuwatch.client import helpers

log = logging.getLogger(__name__)

DEFAULT_ON_DEMAND_STEPS = 5
MAX_ON_DEMAND_STEPS = 1000
ANALYSIS_JOIN_S = 30.0  # at the run's end, how long to wait for a window still being analysed


def profiles_dir(cfg: Config, run_id: str) -> Path:
    return cfg.runs_path / torch_profiler.safe_name(run_id) / "profiles"


class Profiling:
    """One per Run. `on_control` may be called from the transport's thread; everything that
    touches torch.profiler happens in step(), on the training thread."""

    def __init__(self, run_id: str, cfg: Config, send: Callable[..., None], rank: int | None):
        self.active = cfg.profile_active > 0  # the only thing Run.step() reads while idle
        self._run_id = run_id
        self._cfg = cfg
        self._send = send
        self._rank = rank
        self._lock = threading.Lock()
        self._requested = 0  # on-demand steps asked for, not yet started
        self._prof: Any = None  # torch.profiler.profile while a window is recorded
        self._trigger = ""
        self._windows_left = 0  # 0 with a running profiler = repeat forever
        self._recorded: list[int] = []  # run steps inside the current window
        self._disk = FullDisk(log, "gpuwatch: profiler traces")
        self._analysing: list[_Analysis] = []
        if self.active:
            self._start(
                "scheduled", cfg.profile_wait, cfg.profile_warmup, cfg.profile_active, cfg.profile_repeat
            )

    # ---- requests (any thread) ----------------------------------------------------------
    def on_control(self, frame: dict[str, Any]) -> None:
        if frame.get("action") != "profile":
            log.info("gpuwatch: control %r not understood by this client", frame.get("action"))
            return
        steps = min(int(frame.get("steps") or DEFAULT_ON_DEMAND_STEPS), MAX_ON_DEMAND_STEPS)
        self.request(steps)

    def request(self, steps: int) -> None:
        """Profile the next `steps` steps (after the window now running, if any)."""
        with self._lock:
            self._requested = steps
            self.active = True

    # ---- the training thread ------------------------------------------------------------
    def step(self, step: int) -> None:
        """After run step `step` finished."""
        prof = self._prof
        if prof is not None:
            if prof.current_action in _recording():
                self._recorded.append(step)
            prof.step()  # may call _on_ready
            return
        with self._lock:
            steps, self._requested = self._requested, 0
            if not steps:
                self.active = False  # under the lock: a request arriving now is not lost
                return
        # One warm-up step so the window does not time the profiler's own start.
        self._start("on_demand", 0, 1, steps, 1)

    def close(self) -> None:
        """At the end of the run: a window cut short is still saved (with the steps it saw)."""
        prof, self._prof = self._prof, None
        if prof is not None:
            self._windows_left = 1
            try:
                prof.stop()
            except Exception:
                log.warning("gpuwatch: stopping the profiler failed", exc_info=True)
        self.active = False
        deadline = time.monotonic() + ANALYSIS_JOIN_S
        for analysis in self._analysing:
            analysis.finish(deadline)

    def _start(self, trigger: str, wait: int, warmup: int, active: int, repeat: int) -> None:
        self._trigger = trigger
        self._windows_left = repeat
        self._recorded = []
        try:
            self._prof = torch_profiler.start(wait, warmup, active, repeat, self._on_ready)
        except Exception as e:  # e.g. another profiler is already running in this process
            log.warning("gpuwatch: could not start the profiler: %s", e)
            self._prof = None
            return
        self.active = True

    def _on_ready(self, prof: Any) -> None:
        recorded, self._recorded = self._recorded, []
        if not recorded:
            return
        try:
            self._save(prof, recorded)
        except Exception:  # a failed save must never break the user's training step
            log.warning("gpuwatch: could not save a profile", exc_info=True)
        if self._windows_left:
            self._windows_left -= 1
            if not self._windows_left and self._prof is prof:
                self._prof = None
                prof.stop()
                with self._lock:
                    self.active = bool(self._requested)

    def _save(self, prof: Any, recorded: list[int]) -> None:
        ts = now_ms()
        ops = torch_profiler.top_ops(prof)
        rank = "" if self._rank is None else f"-rank{self._rank}"
        stem = f"{self._trigger}-{ts}-steps{recorded[0]}-{recorded[-1]}{rank}"
        max_bytes = int(self._cfg.profile_max_mb * 2**20)
        directory = profiles_dir(self._cfg, self._run_id)
        try:
            saved = torch_profiler.save_trace(prof, directory, stem, max_bytes)
        except OSError as e:
            if not no_space(e):
                raise
            self._disk.failed(directory, e, "profiles keep their top operators, without the trace")
            saved = torch_profiler.SavedTrace(None, None, None)
        else:
            self._disk.ok(directory)
        if saved.note:
            log.warning("gpuwatch: %s", saved.note)
        fields = dict(
            ts_ms=ts,
            trigger=self._trigger,
            rank=self._rank,
            first_step=recorded[0],
            steps=len(recorded),
            trace_path=str(saved.path) if saved.path else None,
            trace_bytes=saved.bytes,
            ops=[vars(op) for op in ops],
        )
        if saved.path is None:
            self._send("profile", **fields)
            return
        self._analysing = [a for a in self._analysing if a.is_alive()] + [
            _Analysis(saved.path, fields, self._send)
        ]


class _Analysis(threading.Thread):
    """Waits, off the training thread, for the trace worker's breakdown of one window, then sends
    the profile event with it (without it if the worker failed: the profile is still stored)."""

    def __init__(self, path: Path, fields: dict[str, Any], send: Callable[..., None]):
        super().__init__(name="gpuwatch-trace-analysis", daemon=True)
        self._path = path
        self._fields = fields
        self._send = send
        self._worker: subprocess.Popen[bytes] | None = None
        self.start()

    def run(self) -> None:
        try:  # started here: even the fork is off the training thread
            self._worker = subprocess.Popen(
                helpers.command("gpuwatch.client.trace_worker", self._path),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=helpers.environment(),
            )
        except OSError as e:
            log.warning("gpuwatch: could not start the analysis of the profile's trace: %s", e)
            self._send("profile", **self._fields)
            return
        out, err = self._worker.communicate()
        if self._worker.returncode == 0:
            try:
                self._fields["breakdown"] = json.loads(out)
            except ValueError:
                log.warning("gpuwatch: the trace worker's breakdown of %s was not JSON", self._path)
        elif self._worker.returncode > 0:  # < 0: stopped by finish() at the run's end
            last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            log.warning("gpuwatch: could not analyse the profile's trace %s: %s", self._path, last[0])
        self._send("profile", **self._fields)

    def finish(self, deadline: float) -> None:
        """At the run's end: wait until `deadline` (monotonic), then stop the worker; the window
        is still stored, without its breakdown."""
        self.join(max(0.0, deadline - time.monotonic()))
        if self.is_alive():
            log.warning(
                "gpuwatch: the profile's trace %s was not analysed in time; stored without its breakdown",
                self._path,
            )
            if self._worker is not None:
                self._worker.kill()
            self.join(5.0)


def _recording() -> tuple[Any, ...]:
    from torch.profiler import ProfilerAction

    return (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

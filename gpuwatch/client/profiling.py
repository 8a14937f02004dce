"""Profiler windows driven by Run.step(): scheduled from the config, or asked for by the daemon.

Run.step() checks one attribute (`active`) and calls step() only while something is profiling
or waiting to: an idle hook costs the training loop a bool test (bench/bench_profiler.py).
Each finished window becomes one `profile` event (top operators, and the trace's breakdown
from gpuwatch.analysis.trace, worked out on a thread of its own so the training step does not
wait for it) and a gzipped Chrome trace under <runs_path>/<run_id>/profiles/.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from collectors import torch_profiler
from gpuwatch.config import Config
from gpuwatch.diskfull import FullDisk, no_space
from gpuwatch.store import now_ms

log = logging.getLogger(__name__)

DEFAULT_ON_DEMAND_STEPS = 5
MAX_ON_DEMAND_STEPS = 1000
ANALYSIS_JOIN_S = 30.0  # at the run's end, how long to wait for a window still being analysed
MAX_STORED_STEPS = 200  # per-step figures kept with a breakdown


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
        self._prof = None
        self._trigger = ""
        self._windows_left = 0  # 0 with a running profiler = repeat forever
        self._recorded: list[int] = []  # run steps inside the current window
        self._disk = FullDisk(log, "gpuwatch: profiler traces")
        self._analysing: list[threading.Thread] = []
        if self.active:
            self._start("scheduled", cfg.profile_wait, cfg.profile_warmup, cfg.profile_active,
                        cfg.profile_repeat)

    # ---- requests (any thread) ----------------------------------------------------------
    def on_control(self, frame: dict) -> None:
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
        for thread in self._analysing:
            thread.join(ANALYSIS_JOIN_S)

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

    def _on_ready(self, prof) -> None:
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

    def _save(self, prof, recorded: list[int]) -> None:
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
        fields = dict(ts_ms=ts, trigger=self._trigger, rank=self._rank, first_step=recorded[0],
                      steps=len(recorded), trace_path=str(saved.path) if saved.path else None,
                      trace_bytes=saved.bytes, ops=[vars(op) for op in ops])
        if saved.path is None:
            self._send("profile", **fields)
            return
        thread = threading.Thread(target=self._analyse_and_send, args=(saved.path, fields),
                                  name="gpuwatch-trace-analysis", daemon=True)
        self._analysing = [t for t in self._analysing if t.is_alive()] + [thread]
        thread.start()

    def _analyse_and_send(self, path: Path, fields: dict) -> None:
        """Off the training thread: the trace's breakdown, then the profile event with it."""
        try:
            fields["breakdown"] = breakdown_of(path)
        except Exception:  # the profile is still stored, without its breakdown
            log.warning("gpuwatch: could not analyse the profile's trace %s", path, exc_info=True)
        self._send("profile", **fields)


def breakdown_of(path: Path) -> dict:
    """The stored breakdown of one profile window: its rank of `gpuwatch trace`, with the advice."""
    from gpuwatch.analysis.trace import analyse_files

    result = analyse_files([path])
    rank = result["ranks"][0]
    rank["steps"] = rank["steps"][-MAX_STORED_STEPS:]
    return {**rank, "advice": result["advice"]}


def _recording() -> tuple:
    from torch.profiler import ProfilerAction

    return (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

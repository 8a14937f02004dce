"""gpuwatch.track(): a run, its steps and generations, and how it ended."""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gpuwatch.base import clock as clock_mod
from gpuwatch.base import config as config_mod
from gpuwatch.base import threads
from gpuwatch.base.clock import elapsed_end_ms, now_ms
from gpuwatch.base.diskfull import free_bytes, show_bytes
from gpuwatch.client import flops, fold, metadata, oom, profiling, torch_stats
from gpuwatch.client.attach import ENV_RUN_ID, ENV_RUN_NAME, end_state_path, new_run_id

if TYPE_CHECKING:
    from gpuwatch.client.transport import Transport

log = logging.getLogger(__name__)

END_FLUSH_TIMEOUT_S = 10.0
# finish() returns within this: the end goes ahead of queued steps; what is still queued then
# is spooled for the daemon to replay.
END_WITHIN_S = 1.0
# step() only records; a thread of ours turns the recorded steps into events (folded past the
# transport's budget, see fold.py) this often while steps come, and the sender sends each
# drain's events as one frame. Every drain and every frame costs the training process a
# wake-up whatever it holds: every 0.5 s, not 0.1 s, those threads took 25 µs of CPU a step on
# the 203-module bench instead of 65. A live view refreshed each second sees a step within this.
DRAIN_EVERY_MS = 500
# Recorded steps waiting for that thread, at most (about 250 bytes each): the client's memory
# stays bounded at any rate, whatever the scheduler does to the thread. Past PENDING_STEPS_HURRY
# (a loop of over 20,000 steps a second) it drains at once instead of at its next half second.
PENDING_STEPS_MAX = 50_000
PENDING_STEPS_HURRY = 10_000
_OOM_MESSAGES = (
    "CUDA out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
)


_PLAIN_COUNTS = {int, type(None)}
_PLAIN_LOSSES = {float, int, type(None)}
_record = tuple.__new__
# Steps recorded so far in each run this process joined or started: a second Run of the same run
# (the `gpuwatch run` wrapper's, joined again by a Trainer's second train()) numbers on from them.
_steps_taken: dict[str, int] = {}


class Readings(Protocol):
    """A step's split as the caller's raw readings, worked out into step fields by the drainer
    thread: off the training loop."""

    now: float  # where the split's interval ended, on time.perf_counter: on the CPU, the step's end

    def fields(self) -> Mapping[str, Any]: ...


class Recorded(NamedTuple):
    """One step as step() recorded it, for the drainer thread to read once the GPU passed it."""

    step: int
    ts_ms: int
    mark: Any  # the step clock's mark: ms on the CPU, a pair of CUDA events
    compute: Any  # where the iteration's compute began (mark_compute), or None
    tokens: Any  # an int, or a tensor count summed on the GPU
    samples: int | None
    seq_len: int | None
    loss: Any  # captured (see torch_stats.capture_loss)
    losses: dict[str, Any] | None  # each captured
    alloc: int | None
    reserved: int | None
    peak: int | None
    split: Mapping[str, Any] | Readings | None


class RecordedColumns(NamedTuple):
    """Recorded steps a column at a time (`RecordedColumns(*zip(*steps))`): Recorded's fields,
    in its order."""

    step: Sequence[int]
    ts_ms: Sequence[int]
    mark: Sequence[Any]
    compute: Sequence[Any]
    tokens: Sequence[Any]
    samples: Sequence[int | None]
    seq_len: Sequence[int | None]
    loss: Sequence[Any]
    losses: Sequence[dict[str, Any] | None]
    alloc: Sequence[int | None]
    reserved: Sequence[int | None]
    peak: Sequence[int | None]
    split: Sequence[Mapping[str, Any] | Readings | None]


class Started(NamedTuple):
    """When a run started, on the wall clock and the monotonic one (its end is timed from both)."""

    ms: int
    monotonic: float


def is_oom(exc: BaseException) -> bool:
    """Out of memory on the GPU (torch.OutOfMemoryError, 'CUDA out of memory') or the host."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    message = str(exc)
    return any(m in message for m in _OOM_MESSAGES)


def error_type(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _whole(value: Any) -> int | None:
    """Counts as plain ints: numpy / torch integers would be refused by the wire's type checks."""
    return value if value is None or type(value) is int else int(value)


def _plain_config(config: Any) -> dict[str, Any] | None:
    """A JSON object from a dict, dataclass or argparse Namespace; odd values become strings."""
    if config is None:
        return None
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    elif not isinstance(config, Mapping) and hasattr(config, "__dict__"):
        config = vars(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, dataclass or Namespace, got {type(config).__name__}")
    plain: dict[str, Any] = json.loads(json.dumps(dict(config), default=str))
    return plain


class Generation:
    """Decode-loop helper: call token() as each token is produced; reports on exit."""

    def __init__(self, run: "Run", prompt_tokens: int | None, clock: Callable[[], float]):
        self._run = run
        self._prompt_tokens = prompt_tokens
        self._clock = clock
        self._start = clock()
        self._last: float | None = None
        self._ttft_ms: float | None = None
        self._itl_ms: list[float] = []
        self.new_tokens = 0

    def token(self, n: int = 1) -> None:
        now = self._clock()
        if self._last is None:
            self._ttft_ms = (now - self._start) * 1000.0
        else:
            self._itl_ms.append((now - self._last) * 1000.0)
        self._last = now
        self.new_tokens += n

    def __enter__(self) -> "Generation":
        return self

    def __exit__(self, *exc: object) -> None:
        total_ms = None if self._last is None else (self._last - self._start) * 1000.0
        self._run.generation(
            prompt_tokens=self._prompt_tokens,
            new_tokens=self.new_tokens,
            ttft_ms=self._ttft_ms,
            itl_ms=self._itl_ms,
            total_ms=total_ms,
        )


def _percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), None for no values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    import statistics  # generations only: not at every client's start

    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


class _Drainer:
    """The thread that turns the steps step() recorded into events within DRAIN_EVERY_MS
    (started with the run, idle until its first step: starting a thread inside a step would
    charge the wait for it to the next step's time)."""

    def __init__(self, run: "Run") -> None:
        self._run = run
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._stopped = False
        # Steps wait for this thread: while they keep coming, it drains them every DRAIN_EVERY_MS
        # unasked (step() reads this, to wake it once per burst and not call wake() every step).
        self.due = False

    def wake(self) -> None:
        """A step waits and this thread is not `due`: drain within DRAIN_EVERY_MS."""
        self.due = True
        self._wake.set()

    def hurry(self) -> None:
        """Steps pile up (PENDING_STEPS_HURRY): drain now, not at the end of this DRAIN_EVERY_MS."""
        self._hurry.set()

    def start(self) -> None:
        threads.start(threading.Thread(target=self._loop, name="gpuwatch-steps", daemon=True))

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._hurry.set()  # (not left sleeping out its half second)

    def _loop(self) -> None:
        run = self._run
        while not self._stopped:
            self._wake.wait()
            self._wake.clear()
            while not self._stopped:
                self._hurry.wait(DRAIN_EVERY_MS / 1000)
                self._hurry.clear()
                if not run._pending:  # no step since the last drain: the burst ended
                    self.due = False  # from here a step wakes this thread
                    if not run._pending:  # (one appended just before that did not)
                        break
                with run._draining:
                    if run._ended:
                        return
                    try:
                        run._drain(wait=False)
                    except Exception:  # a broken CUDA context: the training thread's end says so
                        log.debug("gpuwatch: background drain failed", exc_info=True)
                        return


class Run:
    """One tracked run. Made by track(); usable as a context manager or ended with finish()."""

    def __init__(
        self,
        transport: Transport,
        cfg: config_mod.Config,
        *,
        run_id: str,
        name: str | None,
        config: Any,
        flops_per_token: float | Callable[[int], float] | None,
        precision: str,
        attached: bool,
        parent_run_id: str | None,
        started_s: float | None = None,
        began: float | None = None,
        steps_before: int = 0,
    ):
        self.run_id = run_id
        self.attached = attached  # True: steps go to the `gpuwatch run` wrapper's run
        self._transport = transport
        self._cfg = cfg
        self._flops_per_token = flops_per_token
        self._precision = flops.normalize_dtype(precision)
        self._id_prefix = f"{os.urandom(4).hex()}-"  # event ids: unique per Run, cheap to make
        self._id_count = itertools.count()
        self._last_seq = 0
        # the step number last recorded (see _steps_taken), or the steps a resumed training had
        self._step = max(_steps_taken.get(run_id, 0), steps_before)
        self._stepped = False  # a step came: the clock is chosen
        self._seq_len: int | None = None  # of the last step, for an OOM postmortem
        self._batch: int | None = None
        self._gen = 0
        self._ended = False
        self._pending: collections.deque[Recorded] = collections.deque()
        self._drained_ts: int | None = None  # ts_ms of the last step made an event: the next drain's window
        self._draining = threading.RLock()  # the drainer and the run's end take turns (RLock: a
        # signal handler that ends the run may interrupt a drain)
        self._drainer = _Drainer(self)
        self._compute_mark: Any = None  # where this iteration's compute began (mark_compute), until step()
        self._rss = torch_stats.RssReader()
        self._torch: ModuleType | None = None  # set at the first step if the workload runs on CUDA
        self._peak_flops: float | None = None
        self._saved_handlers: dict[int, Any] = {}

        fields = metadata.collect(wrapper_run_id=parent_run_id)
        plain = _plain_config(config)
        # The run's own copy: note_shape() adds to it while the start event, sent off this thread,
        # may not be encoded yet (a dict changed under the encoder: a config that varies, or fails).
        self._config = dict(plain or {})
        fixed_flops = None if flops_per_token is None or callable(flops_per_token) else float(flops_per_token)
        if attached:
            # The wrapper sent run_start; record who joined and what it was told.
            self.event(
                "attached",
                {"pid": os.getpid(), "name": name, "config": plain, "flops_per_token": fixed_flops, **fields},
            )
        else:
            self._started = Started(now_ms(), time.monotonic())  # the run's end is timed from here too
            if started_s is not None:  # a rank's run lasts as long as its process
                ago_s = max(0.0, self._started.ms / 1000.0 - started_s)
                self._started = Started(int(started_s * 1000), self._started.monotonic - ago_s)
            self._send(
                "run_start",
                ts_ms=self._started.ms,
                name=name,
                config=plain,
                flops_per_token=fixed_flops,
                parent_run_id=parent_run_id,
                **fields,
            )
            self._install_signal_handlers()
        self._saved_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        if metadata.worker_name() is not None:
            from multiprocessing import util

            # (a forked worker leaves by os._exit, past atexit: its own exit hooks still run)
            util.Finalize(None, self._at_worker_exit, exitpriority=100)
        oom.prepare(cfg)
        self._drainer.start()
        self._profiling = profiling.Profiling(self.run_id, cfg, self._send, metadata.process_ranks()[0])
        transport.control_handler = self._profiling.on_control
        # The first step is timed from here (after our own set-up, not including it), or from
        # `began`, a time.perf_counter() reading: where a run started at its first step began.
        cuda = torch_stats.cuda_torch()
        self._start_event = torch_stats.CudaClock.start_event(cuda) if cuda else None
        self._cpu_start = torch_stats.CpuClock(began)
        # The step clock: the CPU's until the first step finds the workload on CUDA (and while
        # no step came, which `_stepped` tells).
        self._clock: torch_stats.CpuClock | torch_stats.CudaClock = self._cpu_start

    # ---- events -------------------------------------------------------------------------
    def _send(self, kind: str, ts_ms: int | None = None, *, urgent: bool = False, **fields: Any) -> None:
        """Queue an event; an urgent one (the run's end) goes ahead of every event queued."""
        self._transport.send(
            {
                "id": self._id_prefix + str(next(self._id_count)),
                "kind": kind,
                "run_id": self.run_id,
                "ts_ms": now_ms() if ts_ms is None else ts_ms,
                **fields,
            },
            urgent=urgent,
        )

    def event(self, kind: str, payload: Mapping[str, Any] | None = None, *, urgent: bool = False) -> None:
        """A free-form run event (e.g. 'checkpoint_saved'); seq is unique across processes of a run."""
        # Microseconds keep the wrapper's and an attached child's sequence numbers apart.
        self._last_seq = max(self._last_seq + 1, time.time_ns() // 1000)
        self._send(
            "run_event", seq=self._last_seq, event_kind=kind, payload=dict(payload or {}), urgent=urgent
        )

    # ---- steps --------------------------------------------------------------------------
    @property
    def steps_recorded(self) -> int:
        return self._step

    def mark_compute(self) -> None:
        """Call once the iteration's batch is ready, just before its forward: the time since the
        previous step() is then the step's data wait (stored as data_wait_pct, its share of the
        step). Later calls before the next step() are ignored, so calling it before every
        micro-batch is fine; before the first step() it does nothing (that step includes the
        set-up). Costs one CUDA event record (no synchronize) or one clock read."""
        if self._compute_mark is None and self._stepped:
            self._compute_mark = self._clock.compute_mark()

    def step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        seq_len: int | None = None,
        loss: Any = None,
        losses: Mapping[str, Any] | None = None,
        split: Mapping[str, Any] | Readings | None = None,
    ) -> None:
        """Record one optimiser step. Never synchronises the GPU: timings and a tensor loss are
        read by a thread of ours once the GPU has passed this point, within DRAIN_EVERY_MS or at
        the end of the run. Costs a record appended to a deque: the events are built (and folded)
        off this thread.
        losses: each optimiser's loss by name (tensors or floats), with several optimisers.
        split: step fields measured by the caller (data_wait_pct, compute_pct, eval_pct,
        closure_evals: the zero-code hooks'), or readings whose fields() works them out on our
        thread (see iteration.StepSplit); a data_wait_pct there replaces mark_compute()'s."""
        if not self._stepped:
            self._stepped = True
            self._clock = self._choose_clock()
        clock = self._clock
        # On the CPU the step ends where the caller's split ended (one clock reading for both:
        # the GIL handed to another thread in between would move up to 5 ms from one step to
        # the next in one of them only), else here, before a loss's .item() below can hand it
        # away. On a GPU the event comes after the copies queued below.
        mark: Any = clock.mark(getattr(split, "now", None)) if type(clock) is torch_stats.CpuClock else None
        self._step += 1
        if type(samples) is not int or type(seq_len) is not int:  # _whole() only when needed: every step
            samples, seq_len = _whole(samples), _whole(seq_len)
        if type(tokens) is not int:
            # A tensor count (unmasked tokens summed on the GPU) is read later, like the loss.
            tokens = torch_stats.capture_loss(tokens) if hasattr(tokens, "detach") else _whole(tokens)
        self._seq_len, self._batch = seq_len, samples
        given = loss
        if loss is not None and type(loss) is not float:
            loss = torch_stats.capture_loss(loss)  # queued before the event: ready with it
        if losses is not None:  # (the step's loss is often one of them, a GAN's D's: read once)
            losses = {
                str(name): loss if value is given else torch_stats.capture_loss(value)
                for name, value in losses.items()
            }
        compute, self._compute_mark = self._compute_mark, None
        if mark is None:
            mark = clock.mark()
        alloc: int | None  # (annotations of locals: no work at run time)
        reserved: int | None
        peak: int | None
        torch = self._torch
        if torch is None:
            alloc = reserved = peak = None
        else:
            alloc, reserved, peak = torch_stats.cuda_memory(torch)
        pending = self._pending
        # (tuple.__new__: Recorded's own __new__ costs three times as much, and this is every step)
        pending.append(
            _record(
                Recorded,
                (
                    self._step,
                    clock_mod.wall_clock_ns() // 1_000_000,  # now_ms(), inlined: every step
                    mark,
                    compute,
                    tokens,
                    samples,
                    seq_len,
                    loss,
                    losses,
                    alloc,
                    reserved,
                    peak,
                    split,
                ),
            )
        )
        waiting = len(pending)
        if waiting < PENDING_STEPS_HURRY:
            if not self._drainer.due:
                self._drainer.wake()
        elif waiting < PENDING_STEPS_MAX:
            if waiting == PENDING_STEPS_HURRY:  # (once as they pile up: a step adds one)
                self._drainer.hurry()
        else:  # the drainer fell behind (starved of the CPU): catch up here rather than grow
            with self._draining:
                self._drain(wait=False)
        if torch is not None:
            every = self._cfg.memory_stats_every
            if every > 0 and self._step % every == 0:
                self._send(
                    "memory_stats",
                    step=self._step,
                    device=torch.cuda.current_device(),
                    **torch_stats.memory_stats_fields(torch.cuda.memory_stats()),
                )
        if self._profiling.active:
            self._profiling.step(self._step)

    def note_shape(self, batch: int | None = None, seq_len: int | None = None, **advice: Any) -> None:
        """The shape of the step under way (the zero-code hooks see it as the forward begins), so
        an OOM before the step ends gets it in its postmortem; `advice`: what else its advice
        weighs (heads, attn, precision), kept where the run's config does not say."""
        self._batch, self._seq_len = _whole(batch), _whole(seq_len)
        for key, value in advice.items():
            if value is not None:
                self._config.setdefault(key, value)

    def _choose_clock(self) -> torch_stats.CpuClock | torch_stats.CudaClock:
        torch = torch_stats.cuda_torch()
        if torch is None:
            return self._cpu_start
        self._torch = torch
        clock = torch_stats.CudaClock(torch, self._start_event)
        self._peak_flops = flops.peak_flops(torch.cuda.get_device_name(), self._precision)
        return clock

    def _drain(self, wait: bool) -> None:
        """Steps the GPU has passed (all of them with wait) -> events, folded past the budget."""
        pending, clock = self._pending, self._clock
        if type(clock) is torch_stats.CpuClock:  # every step is ready: no per-step question
            take = pending.popleft
            raw = [take() for _ in range(len(pending))]
        else:
            raw = []
            while pending and clock.ready(pending[0].mark, wait):
                raw.append(pending.popleft())
        if not raw:
            return
        since = raw[0].ts_ms if self._drained_ts is None else self._drained_ts
        self._drained_ts = raw[-1].ts_ms
        size = fold.group_size(len(raw), max(DRAIN_EVERY_MS, raw[-1].ts_ms - since))
        # One pass per column for the whole drain; below, its columns are read by position (a
        # fold's slices of each, a step's row), whatever each column holds.
        g: tuple[Sequence[Any], ...] = self._read(raw)
        prefix, ids, run_id = self._id_prefix, self._id_count, self.run_id
        peak_flops = self._peak_flops  # none (no GPU): no MFU, and no call to work it out
        events: list[dict[str, Any]] = []  # sent together: one lock of the transport a drain
        send = events.append
        if size > 1:
            for start in range(0, len(raw), size):
                part = fold.Steps(*(column[start : start + size] for column in g))
                send(
                    {
                        "id": prefix + str(next(ids)),
                        "kind": "step",
                        "run_id": run_id,
                        "ts_ms": part.ts_ms[-1],
                        **fold.folded(part, self._mfu),
                    }
                )
            self._transport.send_many(events)
            return
        for (
            step,
            ts,
            step_ms,
            wait_pct,
            tokens,
            samples,
            seq_len,
            loss,
            losses,
            alloc,
            reserved,
            mem_peak,
            rss,
            split,
        ) in zip(*g):
            tps = tokens / (step_ms / 1000.0) if tokens and step_ms else None
            send(
                {
                    "id": prefix + str(next(ids)),
                    "kind": "step",
                    "run_id": run_id,
                    "ts_ms": ts,
                    "step": step,
                    "tokens": tokens,
                    "samples": samples,
                    "seq_len": seq_len,
                    "loss": loss,
                    "losses": fold.finite_losses(losses) if losses else None,
                    "step_time_ms": step_ms,
                    "data_wait_pct": wait_pct,
                    "tokens_per_s": tps,
                    "mfu": self._mfu(tps, seq_len) if peak_flops else None,
                    "mem_allocated_bytes": alloc,
                    "mem_reserved_bytes": reserved,
                    "mem_peak_bytes": mem_peak,
                    "rss_bytes": rss,
                    **(split or {}),
                }
            )
        self._transport.send_many(events)

    def _read(self, group: list[Recorded]) -> fold.Steps:
        """Recorded steps a column at a time, their timings and tensors read (the GPU passed
        them): a few C-level passes over a column, not work per step, when steps come fast."""
        clock, resolve = self._clock, torch_stats.resolve_losses
        columns = RecordedColumns(*zip(*group))
        marks, computes, tokens, loss, losses = (
            columns.mark,
            columns.compute,
            columns.tokens,
            columns.loss,
            columns.losses,
        )
        step_ms = marks if type(clock) is torch_stats.CpuClock else [clock.elapsed_ms(m) for m in marks]
        wait_pct = computes
        if computes.count(None) != len(computes):
            wait_pct = [
                None if c is None else clock.wait_pct(m, c, ms) for m, c, ms in zip(marks, computes, step_ms)
            ]
        if not set(map(type, tokens)) <= _PLAIN_COUNTS:  # tensor counts (summed on the GPU)
            tokens = torch_stats.resolve_counts(tokens)
        if not set(map(type, loss)) <= _PLAIN_LOSSES:
            loss = resolve(loss)
        if any(losses):  # every step's, read together
            read = iter(resolve([v for d in losses if d is not None for v in d.values()]))
            losses = [None if d is None else {name: next(read) for name in d} for d in losses]
        # RSS once a drain (a /proc read; the reader reads at most every 0.25 s anyway), and each
        # step's split worked out from its readings: both off the training thread.
        rss = [self._rss.read()] * len(group)
        # (collections.abc's Mapping: typing's alias of it checks in Python, a µs a step)
        split = [s if s is None or isinstance(s, Mapping) else s.fields() for s in columns.split]
        return fold.Steps(
            columns.step,
            columns.ts_ms,
            step_ms,
            wait_pct,
            tokens,
            columns.samples,
            columns.seq_len,
            loss,
            losses,
            columns.alloc,
            columns.reserved,
            columns.peak,
            rss,
            split,
        )

    def _mfu(self, tps: float | None, seq_len: int | None) -> float | None:
        if not tps or not self._peak_flops:  # (no GPU peak to weigh against: no call of fpt)
            return None
        fpt = self._flops_per_token
        if callable(fpt):
            fpt = fpt(seq_len) if seq_len else None
        return flops.mfu(tps, fpt, self._peak_flops)

    # ---- generations --------------------------------------------------------------------
    def generation(
        self,
        prompt_tokens: int | None = None,
        new_tokens: int | None = None,
        ttft_ms: float | None = None,
        itl_ms: list[float] | None = None,
        total_ms: float | None = None,
    ) -> None:
        """Record one generation: time to first token, inter-token latencies (ms), throughput.

        tokens_per_s = new_tokens / total time; total_ms defaults to ttft + sum(itl)."""
        itl = sorted(itl_ms or [])
        if total_ms is None and ttft_ms is not None:
            total_ms = ttft_ms + sum(itl)
        self._gen += 1
        prompt_tokens, new_tokens = _whole(prompt_tokens), _whole(new_tokens)
        # The peak so far, as step() records it: a decode-only run has no steps to carry it.
        torch = torch_stats.cuda_torch()
        peak = torch_stats.cuda_memory(torch)[2] if torch is not None else None
        self._send(
            "generation",
            gen_id=self._gen,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            ttft_ms=ttft_ms,
            itl_p50_ms=_percentile(itl, 50),
            itl_p90_ms=_percentile(itl, 90),
            tokens_per_s=new_tokens / (total_ms / 1000.0) if new_tokens and total_ms else None,
            mem_peak_bytes=peak,
            rss_bytes=self._rss.read(),
        )

    def generate(
        self, prompt_tokens: int | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> Generation:
        """`with run.generate(prompt_tokens=P) as g: ... g.token()` times a decode loop."""
        return Generation(self, prompt_tokens, clock)

    # ---- ending ---------------------------------------------------------------------------
    def __enter__(self) -> "Run":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:  # (returns None: never swallows the user's exception)
        if exc is None:
            self.finish()
        else:
            self.end_from_exception(exc)

    def finish(self, status: str = "finished") -> None:
        self._end(status)

    def end_from_exception(self, exc: BaseException) -> None:
        """End as the exception says: killed (Ctrl-C), finished/failed (SystemExit), oom, failed."""
        if isinstance(exc, KeyboardInterrupt):
            self._end("killed", signal=int(signal.SIGINT), error_type="KeyboardInterrupt")
        elif isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            self._end(
                "finished" if code == 0 else "failed",
                exit_code=code,
                error_type=None if code == 0 else "SystemExit",
            )
        elif is_oom(exc):
            self._on_oom(exc)
        else:
            self._end("failed", error_type=error_type(exc), error_message=str(exc)[:2000])

    def _on_oom(self, exc: BaseException) -> None:
        """The one place an out-of-memory ends a run: postmortem first, then the end state."""
        try:
            self._send(
                "oom_postmortem",
                **oom.capture(
                    exc,
                    self._cfg,
                    self.run_id,
                    step=self._step + 1,
                    config=self._config,
                    seq_len=self._seq_len or self._config.get("seq_len"),
                    batch=self._batch or self._config.get("batch"),
                ),
            )
        except Exception:  # the user's own error matters more than our postmortem of it
            log.warning("gpuwatch: could not capture the OOM postmortem", exc_info=True)
        self._end("oom", error_type=error_type(exc), error_message=str(exc)[:2000])

    def abandon(self) -> None:
        """Stop sending, with no end event: another Run of the same id (the script's own
        track() under `gpuwatch run`) carries on and ends it."""
        if not self._ended:
            self._ended = True
            self._drainer.stop()
            self._profiling.close()
            self._restore_hooks()
            self._transport.flush(END_FLUSH_TIMEOUT_S)
            self._transport.close()
            self._rss.close()

    def _end(self, status: str, *, drain: bool = True, **fields: Any) -> None:
        if self._ended:
            return
        self._ended = True
        _steps_taken[self.run_id] = self._step
        deadline = time.monotonic() + END_WITHIN_S
        self._drainer.stop()
        try:
            if drain and self._pending:
                with self._draining:
                    self._drain(wait=True)
        except Exception:  # a broken CUDA context must not hide the user's own error
            log.warning("gpuwatch: could not read the last steps' timings", exc_info=True)
        self._profiling.close()
        self._restore_hooks()
        if self.attached:
            self.event("child_end", {"status": status, **fields}, urgent=True)
            self._leave_end_state(status, fields)
        else:
            self._send(
                "run_end",
                ts_ms=elapsed_end_ms(self._started.ms, self._started.monotonic, now_ms(), time.monotonic()),
                status=status,
                urgent=True,
                **fields,
            )
        # The end first, then whatever steps are still queued, both within END_WITHIN_S; what
        # the daemon has not confirmed by then is spooled (replayed by it after we exit).
        self._transport.close(timeout=max(0.1, deadline - time.monotonic()))
        self._rss.close()

    def _leave_end_state(self, status: str, fields: dict[str, Any]) -> None:
        path = end_state_path(self.run_id)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"status": status, **fields}))
            tmp.replace(path)
        except OSError as e:
            log.warning(
                "gpuwatch: could not leave the end state for the wrapper at %s: %s; %s bytes free there",
                path,
                e.strerror or e,
                show_bytes(free_bytes(path.parent)),
            )

    # ---- process hooks ------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        """SIGTERM ends the run as killed, then dies as SIGTERM would; only if the user set none.
        SIGINT needs nothing: its default raises KeyboardInterrupt, which __exit__ handles."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            self._saved_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._end("killed", drain=False, signal=int(signum))
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _excepthook(
        self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        """For runs used without `with`: an uncaught exception ends the run before Python exits."""
        previous = self._saved_excepthook
        self.end_from_exception(exc)
        previous(exc_type, exc, tb)

    def _at_exit(self) -> None:
        self._end("finished")

    def _at_worker_exit(self) -> None:
        """The end of a process that multiprocessing started, from its exit hooks: as the
        exception its target raised says (they run in a `finally` around it), else finished."""
        error = sys.exc_info()[1]
        if error is None:
            self._end("finished")
        else:
            self.end_from_exception(error)

    def _restore_hooks(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._saved_handlers.items():
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, handler)
        self._saved_handlers.clear()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._saved_excepthook
        atexit.unregister(self._at_exit)


# Set by the first track() call: the zero-code hooks of `gpuwatch run` then stand down, so a
# script that tracks itself is counted once, by its own calls.
explicit_track_started = False
_explicit_track_listeners: list[Callable[[], None]] = []


def on_explicit_track(listener: Callable[[], None]) -> None:
    """Call `listener` at the first track(): now, when that already happened."""
    if explicit_track_started:
        listener()
    else:
        _explicit_track_listeners.append(listener)


def track(
    name: str | None = None,
    config: Any = None,
    flops_per_token: float | Callable[[int], float] | None = None,
    run_id: str | None = None,
    precision: str = "bf16",
) -> Run:
    """Start a run and return it; use as `with gpuwatch.track(...) as run:`.

    flops_per_token: model FLOPs per token (see flops.transformer_flops_per_token), or a function
    of seq_len for runs whose sequence length varies; with it each step gets an MFU against the
    GPU's dense peak for `precision`. Under `gpuwatch run`, the run joins the wrapper's run
    (single process), or becomes a run whose parent is the wrapper's: a rank's (world_size > 1),
    or a worker's that the program started with multiprocessing (NAME/<process name>).
    """
    global explicit_track_started
    explicit_track_started = True
    while _explicit_track_listeners:
        _explicit_track_listeners.pop(0)()
    return start_run(
        name=name, config=config, flops_per_token=flops_per_token, run_id=run_id, precision=precision
    )


def start_run(
    name: str | None = None,
    config: Any = None,
    flops_per_token: float | Callable[[int], float] | None = None,
    run_id: str | None = None,
    precision: str = "bf16",
    process: str | None = None,
    began: float | None = None,
    steps_before: int = 0,
) -> Run:
    """track() without marking the run as the script's own: for integrations and the hooks.
    process: this process's name when it is one of several the program started (by default a
    multiprocessing worker's own; a fork's is the caller's to give): under `gpuwatch run` it
    then records a run of its own in the wrapper's job, NAME/process, as a rank does, instead of
    joining the wrapper's run, where its steps would mix with its siblings'.
    began: a time.perf_counter() reading the first step is timed from (by default: now).
    steps_before: the optimiser steps a training resumed from a checkpoint had taken: its first
    step is numbered after them, as the framework numbers it."""
    from gpuwatch.client.helpers import connect

    cfg = config_mod.load()
    wrapper_id = os.environ.get(ENV_RUN_ID) if run_id is None else None
    rank, _, world_size = metadata.process_ranks()
    process = process or metadata.worker_name()
    if (world_size or 1) > 1:
        process = None if rank is None else f"rank{rank}"
    attached = bool(wrapper_id) and (world_size or 1) == 1 and process is None
    started_s = None
    if wrapper_id and not attached:  # one process of the wrapper's job: its name, its process's time
        if name is None and process is not None:
            name = f"{os.environ.get(ENV_RUN_NAME) or 'job'}/{process}"
        started_s = metadata.process_start_s()
    transport = connect(cfg)
    return Run(
        transport,
        cfg,
        run_id=(wrapper_id if attached else run_id) or new_run_id(),  # (attached: wrapper_id is set)
        name=name,
        config=config,
        flops_per_token=flops_per_token,
        precision=precision,
        attached=attached,
        parent_run_id=None if attached else wrapper_id,
        started_s=started_s,
        began=began,
        steps_before=steps_before,
    )

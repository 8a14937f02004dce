"""What `gpuwatch why` finds: a run's phases, its slowdowns and their ranked causes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# A slowdown of at least this much per token, lasting at least this long, is reported. The
# goal (issue 30): >= 30 % for >= 15 s always reported, nothing >= 20 % for >= 10 s on a
# steady run; binned step times are steady to a few per cent, so 20 % is well above noise.
SLOW_PCT = 20.0
MIN_SLOW_MS = 10_000


@dataclass(frozen=True)
class Cause:
    """One thing that explains part of a slowdown; pid/user/command/gpu_index where a process or
    a GPU is to blame. share_pct: the part of the slowdown's extra time per token it explains."""

    kind: str
    share_pct: float
    detail: str
    pid: int | None = None
    user: str | None = None
    command: str | None = None
    gpu_index: int | None = None


@dataclass(frozen=True)
class Phase:
    """A stretch of the run: warm-up, steady, slow, pause (evaluation, checkpoint) or profiler."""

    kind: str
    start_ms: int
    end_ms: int
    first_step: int
    last_step: int
    steps: int  # steps it stands for (folded rows count n_steps)
    ms_per_unit: float | None  # step time per token (per step when tokens are unknown)
    slower_pct: float | None = None  # against the run's steady speed


@dataclass(frozen=True)
class Slowdown:
    start_ms: int
    end_ms: int
    first_step: int
    last_step: int
    slower_pct: float
    causes: tuple[Cause, ...] = ()
    steps: int = 0

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass(frozen=True)
class WhyResult:
    run_id: str
    name: str | None
    unit: str  # "token" or "step": what ms_per_unit is per
    baseline_ms_per_unit: float | None
    phases: tuple[Phase, ...]
    slowdowns: tuple[Slowdown, ...]
    pauses: int = 0  # pauses between steps (evaluation, checkpoints)
    pause_ms: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        """The documented JSON shape of `gpuwatch why --format json`."""
        keys = ("kind", "share_pct", "pid", "user", "command", "gpu_index", "detail")
        return {
            "run": self.run_id,
            "slowdowns": [
                {
                    "start_ms": s.start_ms,
                    "end_ms": s.end_ms,
                    "first_step": s.first_step,
                    "last_step": s.last_step,
                    "slower_pct": round(s.slower_pct, 1),
                    "causes": [{k: asdict(c)[k] for k in keys} for c in s.causes],
                }
                for s in self.slowdowns
            ],
        }

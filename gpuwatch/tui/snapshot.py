"""What the TUI shows, as frozen values: a source builds these off the event loop, widgets render them.

A `View` says which screen is visible (so a poll fetches only what can be seen); a `Snapshot`
is everything that screen needs at one instant. `now_ms` comes from the source, so rendering
never reads the clock (tests pass a fixed one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuwatch.base import fmt

if TYPE_CHECKING:  # the fleet's model loads only with the Fleet screen
    from gpuwatch.fleet.model import Fleet


@dataclass(frozen=True)
class View:
    """Which screen wants data: "overview", "runs", "run" (with run_id and a range in seconds;
    range_s None = the whole run), "oom" or "profile" (with run_id), "capacity", "alerts", or "fleet" / "fleet_jobs" (the Fleet screen's GPUs or jobs)."""

    kind: str
    run_id: str | None = None
    range_s: int | None = None


@dataclass(frozen=True)
class MigRow:
    """A MIG device, listed under its GPU."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str | None  # e.g. "1g.10gb"
    util_pct: float | None = None  # None: NVML gives none for it (shown "n/a")
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    processes: int = 0


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    state: str = "ok"  # ok | lost | hung (NVML calls on it block)
    state_since_ms: int | None = None  # when it entered that state
    util_pct: float | None = None
    util_history: tuple[float | None, ...] = ()  # last minutes, oldest first
    util_history_slot: int = 0  # the first one's slot number since the epoch (sparks.SPARK_SLOT_MS)
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    throttle_reasons: int | None = None
    ecc_uncorrected: int | None = None
    migs: tuple[MigRow, ...] = ()  # its MIG devices, when in MIG mode
    # GPM (Hopper and later) over the last tick, 0-100; None = the GPU gives none ("n/a")
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None

    def problems(self) -> list[str]:
        """What is wrong with this GPU, in words; empty when nothing is."""
        if self.state == "lost":
            return ["LOST"]
        if self.state == "hung":
            return [fmt.gpu_state(self.state, self.state_since_ms).upper().replace("SINCE", "since")]
        words = fmt.throttle_words(self.throttle_reasons)
        if self.ecc_uncorrected:
            words.append(f"ECC errors: {self.ecc_uncorrected}")
        return words


@dataclass(frozen=True)
class HostRow:
    cpu_pct: float | None = None
    load1: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    shm_used_bytes: int | None = None
    shm_total_bytes: int | None = None


@dataclass(frozen=True)
class ProcessRow:
    gpu_index: int
    pid: int
    uid: int | None
    user: str | None
    used_mem_bytes: int | None
    sm_util_pct: float | None
    cpu_pct: float | None
    run_name: str | None
    cmdline: str | None
    gpu_instance_id: int | None = None  # the MIG device it runs on; None off MIG
    compute_instance_id: int | None = None

    @property
    def key(self) -> str:
        return f"{self.gpu_index}:{self.pid}"


@dataclass(frozen=True)
class RunRow:
    run_id: str
    name: str | None
    user: str | None
    status: str
    started_ms: int
    ended_ms: int | None = None
    tokens_per_s_last: float | None = None
    tokens_per_s_avg: float | None = None
    peak_mem_bytes: int | None = None
    oom: bool = False
    rank: int | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class Series:
    """One line of a chart; `unit` picks the axis format: bytes | pct | per_s | ms | loss."""

    label: str
    unit: str
    points: tuple[tuple[int, float], ...]  # (ts_ms, value), oldest first


@dataclass(frozen=True)
class Chart:
    title: str
    series: tuple[Series, ...]
    shaded: tuple[tuple[int, int], ...] = ()  # (start_ms, end_ms) spans drawn on a dark background


@dataclass(frozen=True)
class SlowRow:
    """One slow phase of a run (gpuwatch why) and its ranked causes, as lines to show."""

    start_ms: int
    end_ms: int
    first_step: int
    last_step: int
    slower_pct: float
    unit: str  # token | step
    causes: tuple[str, ...]  # "62 % gpu_cotenant: pid 8812 (bob, ...) on GPU 0 ..."


@dataclass(frozen=True)
class AlertRow:
    """One alert (gpuwatch/store/alerts.py): what happened, to whom, and the command for more."""

    id: int
    ts_ms: int
    kind: str  # run.failed, gpu.idle_held, ...
    title: str
    body: str
    run_id: str | None = None
    gpu_index: int | None = None


@dataclass(frozen=True)
class StacksRow:
    ts_ms: int
    pid: int
    reason: str  # stall | on_demand
    text: str  # formatted stacks, innermost frame last
    error: str | None = None  # why there are no stacks


@dataclass(frozen=True)
class ProfileRow:
    """The newest profile of a run and its top operators (times in us, memory in bytes)."""

    run_id: str
    run_name: str | None
    profile_id: int
    ts_ms: int
    trigger: str
    first_step: int | None
    steps: int | None
    trace_path: str | None
    trace_bytes: int | None
    ops: tuple[
        tuple[str, int | None, float | None, float | None, float | None, float | None, int | None], ...
    ] = ()
    count: int = 1  # profiles the run has
    breakdown_json: str | None = None  # the trace analysis (profile_breakdowns.breakdown_json)


@dataclass(frozen=True)
class CapacityRow:
    """The newest capacity study: points (batch, seq_len, measured or None if OOM, fitted, kind)
    and per batch (batch, max_seq_len, predicted peak, verified peak)."""

    ts_ms: int
    command: str
    device: str | None
    limit_bytes: int | None
    margin: float | None
    points: tuple[tuple[int, int, int | None, float | None, str], ...] = ()
    predictions: tuple[tuple[int, int, int | None, int | None], ...] = ()


@dataclass(frozen=True)
class RunDetail:
    run: RunRow
    host: str | None = None
    pid: int | None = None
    command: str | None = None
    job_id: str | None = None
    end_state: str = ""  # e.g. "exit 1: RuntimeError: ..." ; "" while running
    ranks: tuple[RunRow, ...] = ()  # the other ranks of the same job
    config: tuple[tuple[str, str], ...] = ()
    charts: tuple[Chart, ...] = ()
    since_ms: int = 0  # start of the time range shown
    stacks: StacksRow | None = None  # the newest stack dump (a stall's or on demand)
    profiles: int = 0  # how many profiles the run has (key p shows the newest)
    energy_j: float | None = None  # its share of its GPUs' energy (store/energy.py)
    energy_complete: bool = True  # False: older raw samples had expired ("≥")
    joules_per_token: float | None = None
    slowdowns: tuple[SlowRow, ...] = ()  # slow phases with their causes (gpuwatch why)


@dataclass(frozen=True)
class OomRow:
    """One OOM postmortem as the OOM screen shows it. free_bytes: GPU free memory, or for a host
    OOM the tightest bound (available, cgroup limit less RSS, RLIMIT_AS less address space)."""

    run_id: str
    run_name: str | None
    ts_ms: int
    kind: str  # gpu | host
    device: int | None = None
    requested_bytes: int | None = None
    free_bytes: int | None = None
    total_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    rss_bytes: int | None = None
    cgroup_limit_bytes: int | None = None
    step: int | None = None
    seq_len: int | None = None
    batch: int | None = None
    phase: str | None = None
    neighbours: tuple[tuple[int, str | None, int | None, str | None], ...] | None = (
        None  # pid, user, bytes, run
    )
    advice: tuple[tuple[str, str], ...] = ()  # (title, detail)
    blocks: tuple[tuple[int, str], ...] = ()  # (size_bytes, allocating frame)
    traceback_tail: tuple[str, ...] = ()
    snapshot_path: str | None = None


@dataclass(frozen=True)
class Snapshot:
    now_ms: int
    data_ms: int | None = None  # newest sample in the store; None = no samples
    driver: bool = True  # False: no gpus rows (no NVIDIA driver seen)
    gpus: tuple[GpuRow, ...] = ()
    host: HostRow | None = None
    processes: tuple[ProcessRow, ...] = ()
    runs: tuple[RunRow, ...] = ()
    runs_total: int | None = None  # view "runs": every run in the database (runs: the newest)
    detail: RunDetail | None = None
    postmortems: tuple[OomRow, ...] = ()  # view "oom": the run's OOM postmortems
    profile: ProfileRow | None = None  # view "profile": the run's newest profile
    capacity: CapacityRow | None = None  # view "capacity": the newest capacity study
    fleet: Fleet | None = None  # view "fleet": every host's GPUs and jobs, from Prometheus
    alerts: tuple[AlertRow, ...] = ()  # view "alerts": the newest alerts, newest first
    alert_line: str | None = None  # every view: the alerts of the last hour, for the top line
    problem: str | None = None  # the store could not be read: why
    notice: str | None = None  # a line shown while the data is live (e.g. no daemon)
    spooled: str | None = None  # events waiting in a spool for the daemon: how many, where
    stale_after_ms: int = 15_000  # data older than this: the daemon is away

    def staleness(self) -> str | None:
        """A plain sentence when the data is old (the daemon stopped), else None."""
        if self.problem:
            return self.problem
        if self.data_ms is None:
            return "no samples yet: is the daemon running?"
        age = self.now_ms - self.data_ms
        if age > self.stale_after_ms:
            # Whole minutes: the line then changes once a minute, not every refresh.
            old = f"{age // 60_000} min" if age >= 60_000 else "less than a minute"
            return f"daemon not running: data is {old} old; live again by itself when it is back"
        return None

"""GPUs and the processes on them, from NVML (nvidia-ml-py's `pynvml`), as plain typed records.

Every NVML call goes through NvmlCollector._call: a field the GPU doesn't support or we may
not read comes back as None ("not available") instead of raising, and is not asked again; a
GPU that fell off the bus turns that GPU's sample into state 'lost' while the others go on.

MIG: on a GPU in MIG mode each MIG device (one compute instance of one GPU instance) is found
with nvmlDeviceGetMigDeviceHandleByIndex, again every MIG_RESCAN_MS (instances can be created
and destroyed while the driver runs). Its processes are listed through its own handle (that
works without root, the parent's aggregate list may not) and carry its GPU / compute instance
ids. The parent GPU keeps its own sample: temperature, power and clocks are the whole GPU's.

A GPU in a bad state can make every NVML call on it block (the "nvidia-smi hangs" of real
servers). So the GPUs' reads run in worker threads (collectors/deadline.py), never in the
caller's, in one round a tick (each GPU's sample, processes, MIG devices and GPM together, and
the XID events). The GPUs that answer share one worker, the pool, which reads them one after
another and then the XID events: one hand-over a tick instead of one per GPU, which is most of
what the isolation costs (the threads' wake-ups and their turns at the GIL). A GPU
is sampled as state 'hung' ("not responding") only when one of ITS NVML calls has been in
flight past the deadline, timed from that call's start, and stays so through a window in which
our own process was seen free (so a busy process - a replay, an ingest flood holding the GIL -
is never taken for a hung GPU). The pool's worker then stays with the hung GPU, as its own,
until its call returns and it answers again; the GPUs the pool had not read yet are read by a
new pool in the same round, so the others lose no tick. A GPU that is merely late (our process
busy) gets no sample that tick rather than a false 'hung'. Should the pool's round ever take
more than POOL_MAX_SHARE of the deadline (slow reads), every GPU gets a worker of its own, side
by side, from then on. NVML's system-wide calls (init, XID events, shutdown) get a worker and
the same deadline (the XID events are read by the pool while the system worker is free; should
that read block, the pool's worker becomes the system worker); at start each GPU has its own
worker, so one hung at start holds no other back.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, NamedTuple

from collectors.deadline import HUNG, LATE, TimeoutError, Worker, gather, running_worker

log = logging.getLogger(__name__)

_NOT_AVAILABLE_U64 = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong, if pynvml hands it through
_PSTATE_UNKNOWN = 32
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process not on a MIG device
MIG_RESCAN_MS = 60_000
# NVIDIA documents nvmlDeviceGetPcieThroughput as sampling for about 20 ms per call: when the
# PCIe reads take over this share of a tick (and PCIE_MIN_MS), they run every PCIE_SLOW_EVERY
# ticks only, their last values repeated in between, so they cannot hold every tick back.
PCIE_MAX_SHARE = 0.25
PCIE_MIN_MS = 5.0
PCIE_SLOW_EVERY = 10
DEADLINE_S = 1.0  # a GPU's reads of one tick, when the caller names no deadline
POOL_MAX_SHARE = 0.5  # of the deadline: a pool round longer than this, and the GPUs go side by side
# NVML's start (nvmlInit, each GPU's facts) is given at least this long: without persistence
# mode the driver initialises every GPU on the first nvmlInit, which can take seconds.
INIT_DEADLINE_S = 10.0
_monotonic = time.monotonic
_MIG_PROFILE = re.compile(r"\bMIG (\S+)")  # the driver names a MIG device "<GPU name> MIG 1g.10gb"


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine; the message says why in one line."""


@dataclass(frozen=True)
class GpuStatic:
    """Facts read once per GPU; the columns of table `gpus` less first/last seen and state."""

    gpu_index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    mem_total_bytes: int | None
    power_limit_mw: int | None
    mig_mode: int | None
    driver_version: str | None
    cuda_driver_version: str | None


# The records built every tick (GpuSample, GpuProcessSample, MigSample, GpuProfSample, XidEvent)
# are slots dataclasses, not frozen ones: a frozen dataclass costs four times as much to build,
# and fifty process samples a tick are a visible share of the daemon's CPU. Never changed once
# built all the same.


@dataclass(slots=True)
class GpuSample:
    """One tick of one GPU; the columns of `gpu_samples`. None = not available on this GPU."""

    gpu_index: int
    ts_ms: int
    gpu_util_pct: int | None = None
    mem_util_pct: int | None = None
    mem_used_bytes: int | None = None
    mem_free_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    temp_c: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pcie_tx_kbps: int | None = None
    pcie_rx_kbps: int | None = None
    fan_pct: int | None = None
    pstate: int | None = None
    throttle_reasons: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    state: str | None = None  # None = ok; 'lost' = fell off the bus, 'hung' = NVML calls on it
    #                           block (not responding); no values then


@dataclass(slots=True)
class GpuProcessSample:
    """One process on one GPU at one tick; the columns of `gpu_process_samples`.

    rss_bytes and cpu_pct come from the host side (ProcessCollector.usage): None here.
    """

    gpu_index: int
    pid: int
    ts_ms: int
    kind: str  # compute | graphics | compute+graphics
    used_mem_bytes: int | None
    sm_util_pct: int | None
    mem_util_pct: int | None
    rss_bytes: int | None = None
    cpu_pct: float | None = None
    gpu_instance_id: int | None = None  # the MIG device it runs on; None off MIG
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class MigStatic:
    """A MIG device's facts; the columns of table `mig_devices` less first/last seen."""

    gpu_index: int  # the parent GPU
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-..."
    name: str | None  # as the driver gives it: "<GPU name> MIG 1g.10gb"
    profile: str | None  # "1g.10gb"; "1c.3g.40gb" for a share of a GPU instance
    mem_total_bytes: int | None
    sm_count: int | None


@dataclass(slots=True)
class MigSample:
    """One tick of one MIG device; the columns of `mig_samples`. Most drivers give no
    utilisation for a MIG device: None then, which is "not available", not 0."""

    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    ts_ms: int
    mem_used_bytes: int | None = None
    mem_free_bytes: int | None = None
    gpu_util_pct: int | None = None
    mem_util_pct: int | None = None


@dataclass(slots=True)
class GpuProfSample:
    """GPM (GPU performance monitoring, Hopper and later) figures of one GPU over the interval
    since its previous tick; the columns of `gpu_prof_samples`. Each 0-100; None = not given."""

    gpu_index: int
    ts_ms: int
    sm_active_pct: float | None = None  # SMs with at least one warp (DCGM_FI_PROF_SM_ACTIVE)
    sm_occupancy_pct: float | None = None  # resident warps vs the maximum (..._SM_OCCUPANCY)
    tensor_active_pct: float | None = None  # any tensor pipe active (..._PIPE_TENSOR_ACTIVE)
    dram_active_pct: float | None = None  # DRAM bandwidth used vs the peak (..._DRAM_ACTIVE)


# GpuProfSample's fields and the NVML GPM metric each is read from.
GPM_METRICS = (
    ("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_active_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
_PROCESS_LISTS = (
    ("compute", "nvmlDeviceGetComputeRunningProcesses"),
    ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
)
_GPM = "gpm"  # the _call key of every GPM call: one refusal switches GPM off for that GPU


@dataclass(slots=True)
class XidEvent:
    """A critical XID error reported by the driver; the columns of `xid_events`."""

    ts_ms: int
    gpu_index: int  # -1 when the driver could not say which GPU
    xid: int


class GpuReadings(NamedTuple):
    """sample()'s answer: every GPU's sample and the processes on them."""

    samples: list[GpuSample]
    processes: list[GpuProcessSample]


class GpuTick(NamedTuple):
    """sample_tick()'s answer: one round of every GPU's reads."""

    samples: list[GpuSample]
    processes: list[GpuProcessSample]
    migs: list[MigSample]
    prof: list[GpuProfSample]
    xids: list[XidEvent]


class _Driver(NamedTuple):
    gpu_count: int
    driver_version: str | None
    cuda_version: str | None


class _Pcie(NamedTuple):
    tx_kbps: int | None
    rx_kbps: int | None


class _Util(NamedTuple):
    """A process's mean utilisation of its GPU over the tick, %."""

    sm_pct: int | None
    mem_pct: int | None


class _Instance(NamedTuple):
    """The MIG device a process runs on; None off MIG."""

    gpu_instance_id: int | None
    compute_instance_id: int | None


_NO_UTIL = _Util(None, None)
_OFF_MIG = _Instance(None, None)


class _Reading(NamedTuple):
    """One GPU's reads of one round, done in its worker."""

    sample: GpuSample
    processes: list[GpuProcessSample]
    migs: list[MigSample]
    prof: GpuProfSample | None


class _Round(NamedTuple):
    """One round of the workers: each GPU's answer (its job's result, HUNG or LATE) by index,
    and the system job's result (None if it had none or did not answer)."""

    answers: dict[int, object]
    system: Any


class _GpuLost(Exception):
    """Raised by _call when NVML says the GPU is gone; caught per GPU in sample()."""


@dataclass
class _Gpu:
    index: int
    handle: object
    lost: bool = False
    unsupported: set = field(default_factory=set)  # call keys the GPU refused for good
    last_util_us: int = 0  # newest per-process utilisation sample seen (0 = all buffered)
    migs: list = field(default_factory=list)  # its MIG devices (_Mig), when in MIG mode
    migs_read_ms: int | None = None  # when they were last looked for
    pcie: _Pcie = _Pcie(None, None)  # last PCIe KB/s read
    pcie_s: float = 0.0  # what the PCIe reads took this tick
    # Its own worker while it has one (it did not answer: hung, or late at start; or every GPU
    # once the pool proved slow); None: read by the pool. Unused for a MIG device.
    worker: Worker | None = None
    hung_since_ms: int | None = None  # when its calls first missed the deadline; None = answering
    static_pending: bool = False  # its facts are still to be read (it hung at start)
    gpm: list | None = None  # GPM sample buffers [previous, next], allocated while GPM works
    gpm_request: object = None  # its nvmlGpmMetricsGet request, made once (477 metric slots)
    gpm_primed: bool = False  # the previous buffer holds a sample: the next tick gives figures


@dataclass(slots=True)
class _PoolRound:
    """The pool's job of one round: the GPUs it reads in turn and what each answered so far,
    then the system job (NVML's system-wide reads: the XID events), if it has one."""

    gpus: list[_Gpu]
    system_job: Callable[[], object] | None = None
    answers: dict[int, object] = field(default_factory=dict)
    system: object = None  # the system job's result
    cancelled: bool = False  # the rest is given up on (or read by a new pool): stop
    took_s: float | None = None  # the GPUs' reads, once done


_SYSTEM = "system"  # the pool's `current` while it runs the system job


@dataclass
class _Mig:
    static: MigStatic
    device: _Gpu  # the MIG handle, and the calls it refused (apart from the parent's)


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _mig_profile(name: str | None, attrs) -> str | None:
    """'1g.10gb' from the MIG device's name; else built from its attributes as DCGM does (whose
    rounding can differ from the driver's name: 1g.11gb for H100 NVL's 1g.12gb)."""
    found = _MIG_PROFILE.search(name or "")
    if found:
        return found.group(1)
    if attrs is None:
        return None
    gi, ci = attrs.gpuInstanceSliceCount, attrs.computeInstanceSliceCount
    return f"{f'{ci}c.' if ci != gi else ''}{gi}g.{round(attrs.memorySizeMB / 1024)}gb"


def _instance_ids(process, default: _Instance) -> _Instance:
    """The MIG device of a process record; `default` when it names none."""
    gi = getattr(process, "gpuInstanceId", None)
    ci = getattr(process, "computeInstanceId", None)
    if gi is None or ci is None or gi == _NO_INSTANCE or ci == _NO_INSTANCE:
        return default
    return _Instance(gi, ci)


def _cuda_version(code: int | None) -> str | None:
    return None if code is None else f"{code // 1000}.{code % 1000 // 10}"


def _import_pynvml():
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("NVML unavailable: nvidia-ml-py (module pynvml) is not installed") from None
    return pynvml


class NvmlCollector:
    """Samples every GPU NVML can see. `nvml` is the module to use (default: pynvml)."""

    def __init__(self, nvml=None, deadline_s: float = DEADLINE_S):
        """`deadline_s`: how long one tick waits for a GPU's reads before calling it hung."""
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self.deadline_s = deadline_s
        init_deadline = max(deadline_s, INIT_DEADLINE_S)
        self._system = Worker("gpuwatch-nvml")
        self._pool = Worker("gpuwatch-nvml-gpus")
        self.pooled = True  # the answering GPUs are read one after another by the pool
        n = self._nvml
        self._not_available = {
            n.NVML_ERROR_NOT_SUPPORTED,
            n.NVML_ERROR_NO_PERMISSION,
            n.NVML_ERROR_NOT_FOUND,
            n.NVML_ERROR_FUNCTION_NOT_FOUND,
            n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            n.NVML_ERROR_TIMEOUT,
        }
        # Permanent answers: the same call will never work on this GPU and driver.
        self._never = {
            n.NVML_ERROR_NOT_SUPPORTED,
            n.NVML_ERROR_NO_PERMISSION,
            n.NVML_ERROR_FUNCTION_NOT_FOUND,
            n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        }
        self._lost_codes = {n.NVML_ERROR_GPU_IS_LOST, n.NVML_ERROR_RESET_REQUIRED}
        self._warned: set = set()
        self._closed = False
        self.pcie_every = 1  # PCIe read every this many ticks (PCIE_SLOW_EVERY once they prove slow)
        self.last_tick_ms = self.last_pcie_ms = 0.0  # what the newest sample() took, PCIe apart
        self._ticks = 0
        self._mig_samples: list[MigSample] = []
        try:
            count, self._driver, self._cuda = self._system.call(self._init_library, init_deadline)
        except TimeoutError:
            self._system.close()
            raise NvmlUnavailable(
                f"NVML unavailable: nvmlInit did not answer within {init_deadline:g} s "
                "(a GPU or the driver hangs; try `nvidia-smi`)"
            ) from None
        except NvmlUnavailable:
            self._system.close()
            raise
        self._gpus = [_Gpu(index, None, worker=Worker(f"gpuwatch-nvml-gpu{index}")) for index in range(count)]
        # Lost or hung before its facts could be read: uuid unknown (the column is NOT NULL).
        self.static: list[GpuStatic] = [
            GpuStatic(i, "", None, None, None, None, None, self._driver, self._cuda) for i in range(count)
        ]
        started = gather(
            [(gpu.worker, partial(self._start_gpu, gpu)) for gpu in self._gpus],
            init_deadline,
            2 * init_deadline,
        )
        for gpu in self._gpus:
            answer = started[gpu.worker]
            if answer is HUNG:
                self._not_responding(gpu, int(time.time() * 1000))
            if answer is HUNG or answer is LATE:  # read once it answers, in its worker till then
                gpu.static_pending = True
            else:
                self._to_pool(gpu)
        try:
            self._events = self._system.call(self._register_xid_events, self.deadline_s)
        except TimeoutError:
            self._events = None

    @property
    def mig_static(self) -> list[MigStatic]:
        """The MIG devices found at start or by the latest rescan in sample(), GPU by GPU."""
        return [m.static for gpu in self._gpus for m in gpu.migs]

    def _init_library(self) -> _Driver:
        """nvmlInit, the GPU count and driver versions, or NvmlUnavailable saying why not."""
        n = self._nvml
        try:
            n.nvmlInit()
            count = n.nvmlDeviceGetCount()
        except n.NVMLError as e:
            reasons = {
                n.NVML_ERROR_LIBRARY_NOT_FOUND: "the NVIDIA driver library libnvidia-ml.so.1 was not found (no driver installed?)",
                n.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
                n.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
            }
            raise NvmlUnavailable(
                f"NVML unavailable: {reasons.get(e.value, f'nvmlInit failed: {e}')}"
            ) from None
        driver = _text(self._call(None, "nvmlSystemGetDriverVersion"))
        cuda = _cuda_version(
            self._call(None, "nvmlSystemGetCudaDriverVersion_v2")
            or self._call(None, "nvmlSystemGetCudaDriverVersion")
        )
        return _Driver(count, driver, cuda)

    def _start_gpu(self, gpu: _Gpu) -> None:
        """A GPU's facts and MIG devices (in its worker)."""
        try:
            gpu.handle = self._call(gpu, "nvmlDeviceGetHandleByIndex", gpu.index)
            self.static[gpu.index] = self._read_static(gpu, self._driver, self._cuda)
            gpu.migs = self._read_migs(gpu, self.static[gpu.index].mig_mode)
        except _GpuLost:
            gpu.lost = True

    # -- the one wrapper ------------------------------------------------------------------------
    def _call(self, gpu: _Gpu | None, name: str, *args, key=None):
        """Call nvml.<name>(*args). None = not available; raises _GpuLost if the GPU is gone.

        `key` names the field for remembering "unsupported"; by default the function name and
        the arguments after the handle (clock type, ECC counter, ...).
        """
        if gpu is not None and gpu.unsupported and (key or (name, args[1:])) in gpu.unsupported:
            return None
        fn = getattr(self._nvml, name, None)
        if fn is None:  # an older nvidia-ml-py without this function
            if gpu is not None:
                gpu.unsupported.add(key or (name, args[1:]))
            return None
        # The call's start, on the worker that runs it: how a call that blocks is told from a
        # busy process (collectors/deadline.py). Inline: this runs ~150 times a tick.
        worker = running_worker()
        if worker is not None:
            worker.call_since = _monotonic()
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            if e.value in self._lost_codes:
                raise _GpuLost() from None
            if gpu is not None and e.value in self._never:
                gpu.unsupported.add(key or (name, args[1:]))
            elif e.value not in self._not_available and (name, e.value) not in self._warned:
                self._warned.add((name, e.value))  # say it once, not every tick
                log.warning("NVML %s failed: %s (reading it as not available)", name, e)
            return None
        finally:
            if worker is not None:
                worker.call_since = None

    # -- static ---------------------------------------------------------------------------------
    def _read_static(self, gpu: _Gpu, driver: str | None, cuda: str | None) -> GpuStatic:
        h = gpu.handle
        pci = self._call(gpu, "nvmlDeviceGetPciInfo", h)
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", h)
        power = self._call(gpu, "nvmlDeviceGetEnforcedPowerLimit", h) or self._call(
            gpu, "nvmlDeviceGetPowerManagementLimit", h
        )
        return GpuStatic(
            gpu_index=gpu.index,
            uuid=_text(self._call(gpu, "nvmlDeviceGetUUID", h)) or "",
            name=_text(self._call(gpu, "nvmlDeviceGetName", h)),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            mem_total_bytes=mem.total if mem is not None else None,
            power_limit_mw=power,
            mig_mode=self._mig_mode(gpu),
            driver_version=driver,
            cuda_driver_version=cuda,
        )

    # -- per tick -------------------------------------------------------------------------------
    def sample(self, ts_ms: int) -> GpuReadings:
        """Every GPU's sample and processes; returns within about 2 x deadline_s whatever NVML
        does. A GPU that is late without a call shown to block has no sample this time."""
        tick = self._tick(ts_ms, gpm=False, xids=False)
        return GpuReadings(tick.samples, tick.processes)

    def sample_tick(self, ts_ms: int) -> GpuTick:
        """sample(), sample_mig(), sample_gpm() and xid_events() in ONE round of the workers
        (one hand-over to each a tick, not three)."""
        return self._tick(ts_ms, gpm=True, xids=True)

    def _tick(self, ts_ms: int, gpm: bool, xids: bool) -> GpuTick:
        started = time.perf_counter()
        self._ticks += 1
        try:
            return self._sample_all(ts_ms, gpm, xids)
        finally:
            self._time_tick(time.perf_counter() - started)

    def not_responding_since(self, index: int) -> int | None:
        """When GPU `index` stopped answering (ms since the epoch); None while it answers."""
        return self._gpus[index].hung_since_ms

    def _time_tick(self, tick_s: float) -> None:
        # What holds a tick back: the pool's PCIe reads, one after another, or the slowest of
        # the GPUs read side by side in workers of their own.
        pcie_s = max(
            [sum(gpu.pcie_s for gpu in self._gpus if gpu.worker is None)]
            + [gpu.pcie_s for gpu in self._gpus if gpu.worker is not None]
        )
        self.last_tick_ms, self.last_pcie_ms = tick_s * 1000, pcie_s * 1000
        if self.pcie_every == 1 and self.last_pcie_ms > max(PCIE_MIN_MS, PCIE_MAX_SHARE * self.last_tick_ms):
            self.pcie_every = PCIE_SLOW_EVERY
            log.warning(
                "PCIe throughput reads took %.0f ms of a %.0f ms GPU tick: reading them every %d "
                "ticks from now on",
                self.last_pcie_ms,
                self.last_tick_ms,
                PCIE_SLOW_EVERY,
            )

    def _ask_every_gpu(self, job, system_job=None) -> _Round:
        """One round: job(gpu) for every GPU and system_job, side by side: the pool reads its
        GPUs in turn (and then runs system_job, while the system worker is free), a GPU with a
        worker of its own is read there. A worker still in an earlier call is not asked again:
        HUNG once shown blocked, else watched for blocking this round. system_job's result is
        None when it did not run to the end in this round."""
        pooled = [gpu for gpu in self._gpus if gpu.worker is None]
        own = [gpu for gpu in self._gpus if gpu.worker is not None]
        if system_job is not None and self._system.busy:
            system_job = None  # its worker is still in an earlier call
        pool, pool_round, jobs = self._pool, None, []
        if pooled:
            if not pool.busy:
                pool_round, system_job = _PoolRound(pooled, system_job), None
            jobs.append((pool, partial(self._read_pool, pool, pool_round, job) if pool_round else None))
        for gpu in own:
            if not gpu.worker.busy:
                jobs.append((gpu.worker, partial(job, gpu)))
            elif gpu.hung_since_ms is None:
                jobs.append((gpu.worker, None))
        if system_job is not None:
            jobs.append((self._system, system_job))
        got = gather(jobs, self.deadline_s, 2 * self.deadline_s)
        answers: dict[int, object] = {}
        for gpu in own:
            answer = answers[gpu.index] = got.get(gpu.worker, HUNG)
            if self.pooled and answer is not HUNG and answer is not LATE:
                self._to_pool(gpu)  # it answers again
        if pooled:
            answers.update(self._pool_answers(pooled, pool, pool_round, got[pool], job))
        system = pool_round.system if pool_round is not None else got.get(self._system)
        return _Round(answers, None if system is HUNG or system is LATE else system)

    def _read_pool(self, pool: Worker, pool_round: _PoolRound, job) -> None:
        """job(gpu) for each GPU of the round in turn, in the pool's worker."""
        started = time.perf_counter()
        try:
            for gpu in pool_round.gpus:
                if pool_round.cancelled:
                    return
                pool.current = gpu  # whose call it is, should one block
                pool_round.answers[gpu.index] = job(gpu)
            pool_round.took_s = time.perf_counter() - started
            if pool_round.system_job is not None and not pool_round.cancelled:
                pool.current = _SYSTEM
                pool_round.system = pool_round.system_job()
        finally:
            pool.current = None

    def _pool_answers(
        self, pooled: list[_Gpu], pool: Worker, pool_round: _PoolRound | None, outcome, job
    ) -> dict:
        """The pooled GPUs' answers, from what the pool did in a round (`outcome`: gather's)."""
        read = dict(pool_round.answers) if pool_round is not None else {}
        if outcome is not HUNG and outcome is not LATE:
            if pool_round is not None and pool_round.took_s is not None:
                self._check_pool(pool_round.took_s)
            return read
        if pool_round is not None:
            pool_round.cancelled = True  # what it has not read yet: given up on, or read below
        if outcome is LATE:  # our process was busy: what was read, and no sample for the rest
            return {gpu.index: read.get(gpu.index, LATE) for gpu in pooled}
        # Blocked in a GPU's call: the worker stays with that GPU as its own (in a system-wide
        # call: it is the system worker now); a new pool reads the GPUs not read yet, now.
        stuck = pool.current
        self._pool = Worker("gpuwatch-nvml-gpus")
        if isinstance(stuck, _Gpu):
            stuck.worker = pool
            read[stuck.index] = HUNG
        elif stuck is _SYSTEM:
            self._system.close()  # free (the pool ran the system job only then)
            self._system = pool
        else:
            pool.close()
        rest = [gpu for gpu in pooled if gpu.index not in read]
        if not rest:
            return read
        rest_round = _PoolRound(rest)
        got = gather(
            [(self._pool, partial(self._read_pool, self._pool, rest_round, job))],
            self.deadline_s,
            2 * self.deadline_s,
        )
        read.update(self._pool_answers(rest, self._pool, rest_round, got[self._pool], job))
        return read

    def _to_pool(self, gpu: _Gpu) -> None:
        """The GPU answers: the pool reads it from the next round on (its worker ends)."""
        if gpu.worker is not None:
            gpu.worker.close()
            gpu.worker = None

    def _check_pool(self, took_s: float) -> None:
        """Reads one after another too slow for the deadline: side by side from now on."""
        if not self.pooled or took_s <= POOL_MAX_SHARE * self.deadline_s:
            return
        self.pooled = False
        log.warning(
            "reading the GPUs one after another took %.0f ms (deadline %.0f ms): each is read in "
            "a thread of its own from now on",
            took_s * 1000,
            self.deadline_s * 1000,
        )
        for gpu in self._gpus:
            if gpu.worker is None:
                gpu.worker = Worker(f"gpuwatch-nvml-gpu{gpu.index}")
        self._pool.close()  # its thread ends (after the round it may still be in)

    def _sample_all(self, ts_ms: int, gpm: bool, xids: bool) -> GpuTick:
        round_ = self._ask_every_gpu(
            partial(self._read_gpu, ts_ms=ts_ms, gpm=gpm),
            partial(self._read_xids, ts_ms) if xids and self._events is not None else None,
        )
        tick = GpuTick([], [], [], [], round_.system or [])
        for gpu in self._gpus:
            answer = round_.answers[gpu.index]
            if answer is LATE:  # our process was busy, the GPU not shown to block: no sample
                continue
            if answer is HUNG:
                self._not_responding(gpu, ts_ms)
                tick.samples.append(GpuSample(gpu.index, ts_ms, state="hung"))
                continue
            self._responding(gpu, ts_ms)
            assert isinstance(answer, _Reading)
            tick.samples.append(answer.sample)
            tick.processes.extend(answer.processes)
            tick.migs.extend(answer.migs)
            if answer.prof is not None:
                tick.prof.append(answer.prof)
        self._mig_samples = tick.migs
        return tick

    def _read_gpu(self, gpu: _Gpu, ts_ms: int, gpm: bool = False) -> _Reading:
        """One GPU's tick, in its worker: its sample, its processes, its MIG devices' samples,
        and with `gpm` its GPM figures."""
        gpu.pcie_s = 0.0
        try:
            if gpu.lost:
                self._recheck(gpu)
            if gpu.static_pending:
                self._start_gpu(gpu)
                gpu.static_pending = False
            if gpu.migs_read_ms is None:  # found at start; rescanned from now on
                gpu.migs_read_ms = ts_ms
            elif not 0 <= ts_ms - gpu.migs_read_ms < MIG_RESCAN_MS:
                gpu.migs, gpu.migs_read_ms = self._read_migs(gpu, self._mig_mode(gpu)), ts_ms
            sample = self._sample_gpu(gpu, ts_ms)
            processes = self._sample_processes(gpu, ts_ms)
            migs = self._sample_migs(gpu, ts_ms)
        except _GpuLost:
            if not gpu.lost:
                log.warning("GPU %d is lost (fell off the bus or needs a reset)", gpu.index)
            gpu.lost = True
            sample, processes, migs = GpuSample(gpu.index, ts_ms, state="lost"), [], []
        return _Reading(sample, processes, migs, self._gpm_of(gpu, ts_ms) if gpm else None)

    def _not_responding(self, gpu: _Gpu, ts_ms: int) -> None:
        if gpu.hung_since_ms is None:
            gpu.hung_since_ms = ts_ms
            log.warning(
                "GPU %d is not responding: an NVML call on it has not returned within %.2g s "
                "(sampling the other GPUs and the host on)",
                gpu.index,
                self.deadline_s,
            )

    def _responding(self, gpu: _Gpu, ts_ms: int) -> None:
        if gpu.hung_since_ms is not None:
            log.warning(
                "GPU %d answers again after %.0f s not responding",
                gpu.index,
                max(0, ts_ms - gpu.hung_since_ms) / 1000,
            )
            gpu.hung_since_ms = None

    def _recheck(self, gpu: _Gpu) -> None:
        """Two cheap calls; raises _GpuLost while the GPU is still gone."""
        handle = self._call(gpu, "nvmlDeviceGetHandleByIndex", gpu.index)
        if handle is None or self._call(gpu, "nvmlDeviceGetUUID", handle) is None:
            raise _GpuLost()
        gpu.handle, gpu.lost = handle, False
        gpu.migs = self._read_migs(gpu, self._mig_mode(gpu))  # new handles for its MIG devices
        log.warning("GPU %d answers again", gpu.index)

    def _sample_gpu(self, gpu: _Gpu, ts_ms: int) -> GpuSample:
        n, h, call = self._nvml, gpu.handle, self._call
        util = call(gpu, "nvmlDeviceGetUtilizationRates", h)
        mem = self._memory(gpu)
        reasons = call(gpu, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:  # the name before driver 535
            reasons = call(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        pstate = call(gpu, "nvmlDeviceGetPerformanceState", h)
        pcie = self._pcie(gpu)
        return GpuSample(
            gpu_index=gpu.index,
            ts_ms=ts_ms,
            gpu_util_pct=util.gpu if util is not None else None,
            mem_util_pct=util.memory if util is not None else None,
            mem_used_bytes=mem.used if mem is not None else None,
            mem_free_bytes=mem.free if mem is not None else None,
            mem_reserved_bytes=getattr(mem, "reserved", None),
            temp_c=call(gpu, "nvmlDeviceGetTemperature", h, n.NVML_TEMPERATURE_GPU),
            power_mw=call(gpu, "nvmlDeviceGetPowerUsage", h),
            energy_mj=call(gpu, "nvmlDeviceGetTotalEnergyConsumption", h),
            sm_clock_mhz=call(gpu, "nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM),
            mem_clock_mhz=call(gpu, "nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_MEM),
            pcie_tx_kbps=pcie.tx_kbps,
            pcie_rx_kbps=pcie.rx_kbps,
            fan_pct=call(gpu, "nvmlDeviceGetFanSpeed", h),
            pstate=None if pstate == _PSTATE_UNKNOWN else pstate,
            throttle_reasons=reasons,
            ecc_corrected=call(
                gpu, "nvmlDeviceGetTotalEccErrors", h, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC
            ),
            ecc_uncorrected=call(
                gpu,
                "nvmlDeviceGetTotalEccErrors",
                h,
                n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                n.NVML_VOLATILE_ECC,
            ),
        )

    def persistence_mode(self, index: int) -> int | None:
        """1 when the driver stays loaded with no client (nvidia-smi's persistence_mode), else 0."""
        gpu = self._gpus[index]
        worker = gpu.worker or self._pool
        if gpu.lost or worker.busy:
            return None

        def read() -> int | None:
            worker.current = gpu  # whose call it is, should it block
            try:
                return self._call(gpu, "nvmlDeviceGetPersistenceMode", gpu.handle)
            finally:
                worker.current = None

        try:
            return worker.call(read, self.deadline_s)
        except (TimeoutError, _GpuLost):
            return None

    def _pcie(self, gpu: _Gpu) -> _Pcie:
        if self.pcie_every > 1 and self._ticks % self.pcie_every:
            return gpu.pcie
        started = time.perf_counter()
        n, h = self._nvml, gpu.handle
        gpu.pcie = _Pcie(
            self._call(gpu, "nvmlDeviceGetPcieThroughput", h, n.NVML_PCIE_UTIL_TX_BYTES),
            self._call(gpu, "nvmlDeviceGetPcieThroughput", h, n.NVML_PCIE_UTIL_RX_BYTES),
        )
        gpu.pcie_s += time.perf_counter() - started
        return gpu.pcie

    def _memory(self, gpu: _Gpu):
        # v2 splits out what the driver reserves; drivers without it fail once, then v1 only.
        v2 = getattr(self._nvml, "nvmlMemory_v2", None)
        return (self._call(gpu, "nvmlDeviceGetMemoryInfo", gpu.handle, v2) if v2 else None) or self._call(
            gpu, "nvmlDeviceGetMemoryInfo", gpu.handle
        )

    def _sample_processes(self, gpu: _Gpu, ts_ms: int) -> list[GpuProcessSample]:
        kinds: dict[int, str] = {}  # "compute", "graphics" or "compute+graphics"
        mem: dict[int, int | None] = {}
        instance: dict[int, _Instance] = {}
        # In MIG mode each MIG device lists its own processes; else the GPU lists them all.
        sources = [
            (m.device, _Instance(m.static.gpu_instance_id, m.static.compute_instance_id)) for m in gpu.migs
        ] or [(gpu, _OFF_MIG)]
        for kind, name in _PROCESS_LISTS:
            used_by_pid: dict[int, int | None] = {}
            for device, ids in sources:
                for p in self._call(device, name, device.handle) or ():
                    pid, used = p.pid, p.usedGpuMemory
                    if used is not None and used >= _NOT_AVAILABLE_U64:
                        used = None
                    # A pid listed twice (one entry per MIG instance): add them up.
                    before = used_by_pid.get(pid)
                    used_by_pid[pid] = used if before is None else before + (used or 0)
                    if pid not in instance:
                        instance[pid] = _instance_ids(p, ids)
            for pid, used in used_by_pid.items():
                if pid not in kinds:
                    kinds[pid], mem[pid] = kind, used
                    continue
                kinds[pid] += "+" + kind
                # Compute and graphics entries of one pid describe the same memory: keep the larger.
                known = mem[pid]
                mem[pid] = used if known is None else known if used is None else max(known, used)
        if not kinds:
            return []
        utils = self._process_utilisation(gpu)
        index, samples = gpu.index, []
        for pid in sorted(kinds):
            util, ids = utils.get(pid, _NO_UTIL), instance[pid]
            samples.append(
                GpuProcessSample(
                    index, pid, ts_ms, kinds[pid], mem[pid], util.sm_pct, util.mem_pct, None, None,
                    ids.gpu_instance_id, ids.compute_instance_id,
                )
            )  # fmt: skip
        return samples

    def _process_utilisation(self, gpu: _Gpu) -> dict[int, _Util]:
        """Mean SM / memory utilisation per pid over the samples newer than the last tick's."""
        samples = self._call(
            gpu, "nvmlDeviceGetProcessUtilization", gpu.handle, gpu.last_util_us, key="process_utilization"
        )
        # Drivers may hand back the boundary sample again; count each sample once.
        fresh = [s for s in samples or () if s.timeStamp > gpu.last_util_us]
        if not fresh:
            return {}
        gpu.last_util_us = max(s.timeStamp for s in fresh)
        by_pid: dict[int, list] = defaultdict(list)
        for s in fresh:
            by_pid[s.pid].append(s)
        return {
            pid: _Util(
                round(sum(s.smUtil for s in ss) / len(ss)), round(sum(s.memUtil for s in ss) / len(ss))
            )
            for pid, ss in by_pid.items()
        }

    # -- MIG ------------------------------------------------------------------------------------
    def _mig_mode(self, gpu: _Gpu) -> int | None:
        modes = self._call(gpu, "nvmlDeviceGetMigMode", gpu.handle)  # [current, pending]
        return modes[0] if modes is not None else None

    def _read_migs(self, gpu: _Gpu, mode: int | None) -> list[_Mig]:
        """The GPU's MIG devices now, given its current MIG mode; none unless that is on."""
        if mode != self._nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        found = []
        for index in range(self._call(gpu, "nvmlDeviceGetMaxMigDeviceCount", gpu.handle) or 0):
            # NOT_FOUND (None here) for an index with no MIG device: the next may have one.
            handle = self._call(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, index)
            if handle is None:
                continue
            device = _Gpu(gpu.index, handle)
            gi = self._call(device, "nvmlDeviceGetGpuInstanceId", handle)
            ci = self._call(device, "nvmlDeviceGetComputeInstanceId", handle)
            if gi is None or ci is None:
                continue
            name = _text(self._call(device, "nvmlDeviceGetName", handle))
            attrs = self._call(device, "nvmlDeviceGetAttributes", handle)
            mem = self._call(device, "nvmlDeviceGetMemoryInfo", handle)
            found.append(
                _Mig(
                    MigStatic(
                        gpu_index=gpu.index,
                        gpu_instance_id=gi,
                        compute_instance_id=ci,
                        uuid=_text(self._call(device, "nvmlDeviceGetUUID", handle)) or "",
                        name=name,
                        profile=_mig_profile(name, attrs),
                        mem_total_bytes=mem.total if mem else None,
                        sm_count=attrs.multiprocessorCount if attrs is not None else None,
                    ),
                    device,
                )
            )
        return found

    def sample_mig(self, ts_ms: int) -> list[MigSample]:
        """Memory and (where the driver gives it) utilisation of every MIG device, read by the
        latest sample() (call it after sample(); `ts_ms` is that sample's; sample_tick() gives
        them itself)."""
        return [m for m in self._mig_samples if m.ts_ms == ts_ms]

    def _sample_migs(self, gpu: _Gpu, ts_ms: int) -> list[MigSample]:
        samples = []
        for m in gpu.migs:
            mem = self._memory(m.device)
            util = self._call(m.device, "nvmlDeviceGetUtilizationRates", m.device.handle)
            samples.append(
                MigSample(
                    gpu.index,
                    m.static.gpu_instance_id,
                    m.static.compute_instance_id,
                    ts_ms,
                    mem_used_bytes=mem.used if mem is not None else None,
                    mem_free_bytes=mem.free if mem is not None else None,
                    gpu_util_pct=util.gpu if util is not None else None,
                    mem_util_pct=util.memory if util is not None else None,
                )
            )
        return samples

    # -- GPM (Hopper and later) ------------------------------------------------------------------
    def sample_gpm(self, ts_ms: int) -> list[GpuProfSample]:
        """GPM figures of every GPU that has them, over the interval since the previous call
        (one nvmlGpmSampleGet per GPU and tick, into the older of its two buffers); none for a
        GPU without GPM, a lost GPU, or at a GPU's first call. Call it after sample(). Each
        GPU is read in its worker, with the deadline: a hung GPU gives none."""
        answers = self._ask_every_gpu(partial(self._gpm_of, ts_ms=ts_ms)).answers
        return [prof for _, prof in sorted(answers.items()) if isinstance(prof, GpuProfSample)]

    def _gpm_of(self, gpu: _Gpu, ts_ms: int) -> GpuProfSample | None:
        if gpu.lost:
            self._free_gpm(gpu)
            return None
        try:
            return self._gpm_values(gpu, ts_ms)
        except _GpuLost:
            self._free_gpm(gpu)  # the next sample() finds it lost and says so
            return None

    def _gpm_values(self, gpu: _Gpu, ts_ms: int) -> GpuProfSample | None:
        if _GPM in gpu.unsupported:
            return None
        if gpu.gpm is None and not self._alloc_gpm(gpu):
            return None
        previous, current = gpu.gpm
        if self._call(gpu, "nvmlGpmSampleGet", gpu.handle, current, key=_GPM) is None:
            if _GPM in gpu.unsupported:
                self._free_gpm(gpu)
            gpu.gpm_primed = False
            return None
        gpu.gpm = [current, previous]  # the newest sample is the next interval's start
        if not gpu.gpm_primed:
            gpu.gpm_primed = True
            return None
        n, request = self._nvml, gpu.gpm_request
        request.sample1, request.sample2 = previous, current
        got = self._call(gpu, "nvmlGpmMetricsGet", request, key=_GPM)
        if got is None:
            if _GPM in gpu.unsupported:
                self._free_gpm(gpu)
            return None
        return GpuProfSample(
            gpu.index,
            ts_ms,
            *(  # in GPM_METRICS' order, as requested
                round(m.value, 2) if m.nvmlReturn == n.NVML_SUCCESS and 0 <= m.value <= 100 else None
                for m in got.metrics[: len(GPM_METRICS)]
            ),
        )

    def _alloc_gpm(self, gpu: _Gpu) -> bool:
        """Two sample buffers for a GPU whose driver says it has GPM; False (for good) if not."""
        support = self._call(gpu, "nvmlGpmQueryDeviceSupport", gpu.handle, key=_GPM)
        if support is None or not support.isSupportedDevice:
            gpu.unsupported.add(_GPM)
            return False
        buffers = [self._call(gpu, "nvmlGpmSampleAlloc", key=_GPM) for _ in range(2)]
        gpu.gpm, gpu.gpm_primed = buffers, False
        if None in buffers:
            self._free_gpm(gpu)
            gpu.unsupported.add(_GPM)
            return False
        if gpu.gpm_request is None:
            n = self._nvml
            gpu.gpm_request = request = n.c_nvmlGpmMetricsGet_t()
            request.version = n.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            for i, (_, metric) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = getattr(n, metric)
        return True

    def _free_gpm(self, gpu: _Gpu) -> None:
        """Give back a GPU's GPM buffers (a lost GPU gets new ones when it answers again)."""
        buffers, gpu.gpm, gpu.gpm_primed = gpu.gpm, None, False
        for buffer in buffers or ():
            if buffer is not None:
                try:
                    self._nvml.nvmlGpmSampleFree(buffer)
                except self._nvml.NVMLError:
                    pass

    # -- XID events -----------------------------------------------------------------------------
    def _register_xid_events(self):
        xid = getattr(self._nvml, "nvmlEventTypeXidCriticalError", None)
        events = self._call(None, "nvmlEventSetCreate") if xid else None
        if events is None:
            return None
        for gpu in self._gpus:
            if gpu.lost or gpu.static_pending:  # a GPU hung at start would hang this too
                continue
            try:
                supported = self._call(gpu, "nvmlDeviceGetSupportedEventTypes", gpu.handle)
                if supported and supported & xid:
                    self._call(
                        gpu, "nvmlDeviceRegisterEvents", gpu.handle, xid, events, key="register_events"
                    )
            except _GpuLost:
                gpu.lost = True
        return events

    def xid_events(self, ts_ms: int) -> list[XidEvent]:
        """Critical XID errors since the last call; never waits (timeout 0) beyond the deadline."""
        if self._events is None or self._system.busy:
            return []
        try:
            return self._system.call(partial(self._read_xids, ts_ms), self.deadline_s)
        except TimeoutError:
            return []

    def _read_xids(self, ts_ms: int) -> list[XidEvent]:
        found: list[XidEvent] = []
        for _ in range(64):  # a bound, in case a broken GPU floods the set
            try:
                data = self._call(None, "nvmlEventSetWait", self._events, 0)
            except _GpuLost:
                break
            if data is None:
                break
            try:
                index = self._call(None, "nvmlDeviceGetIndex", data.device)
            except _GpuLost:  # XID 79, "fallen off the bus", can make even this fail
                index = None
            found.append(XidEvent(ts_ms, -1 if index is None else index, int(data.eventData)))
        return found

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._system.busy:
            try:
                self._system.call(self._shutdown, self.deadline_s)
            except TimeoutError:
                log.warning("nvmlShutdown did not return within %.2g s; leaving it", self.deadline_s)
        for worker in [self._system, self._pool] + [gpu.worker for gpu in self._gpus if gpu.worker]:
            worker.close()

    def _shutdown(self) -> None:
        for gpu in self._gpus:
            if not (gpu.worker or self._pool).busy:  # a hung GPU's buffers are left to the process's end
                self._free_gpm(gpu)
        if self._events is not None:
            try:
                self._call(None, "nvmlEventSetFree", self._events)
            except _GpuLost:
                pass
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

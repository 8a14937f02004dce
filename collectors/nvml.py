"""GPUs and the processes on them, from NVML (nvidia-ml-py's `pynvml`), as plain typed records.

Every NVML call goes through NvmlCollector._call: a field the GPU doesn't support or we may
not read comes back as None ("not available") instead of raising, and is not asked again; a
GPU that fell off the bus turns that GPU's sample into state 'lost' while the others go on.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_NOT_AVAILABLE_U64 = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong, if pynvml hands it through
_PSTATE_UNKNOWN = 32
# NVIDIA documents nvmlDeviceGetPcieThroughput as sampling for ~20 ms per call: with 8 GPUs that
# can be most of a tick. Above this share of the tick the counters move to their own slower job.
PCIE_MAX_SHARE = 0.25
PCIE_DECIDE_TICKS = 5  # decided once, on the median share of the first ticks (one slow tick is noise)


def pcie_too_costly(pcie_s: float, tick_s: float, share: float = PCIE_MAX_SHARE) -> bool:
    """True when reading the PCIe counters took more than `share` of the tick they were in."""
    return tick_s > 0 and pcie_s > share * tick_s


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


@dataclass(frozen=True)
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
    state: str | None = None  # None = ok; 'lost' = fell off the bus (no values then)


@dataclass(frozen=True)
class GpuProcessSample:
    """One process on one GPU at one tick; the columns of `gpu_process_samples`.

    rss_bytes and cpu_pct come from the host side (ProcessCollector.usage); the caller fills
    them with dataclasses.replace.
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


@dataclass(frozen=True)
class XidEvent:
    """A critical XID error reported by the driver; the columns of `xid_events`."""
    ts_ms: int
    gpu_index: int  # -1 when the driver could not say which GPU
    xid: int


class _GpuLost(Exception):
    """Raised by _call when NVML says the GPU is gone; caught per GPU in sample()."""


@dataclass
class _Gpu:
    index: int
    handle: object
    lost: bool = False
    unsupported: set = field(default_factory=set)  # call keys the GPU refused for good
    last_util_us: int = 0  # newest per-process utilisation sample seen (0 = all buffered)


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


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

    def __init__(self, nvml=None):
        self._nvml = nvml if nvml is not None else _import_pynvml()
        n = self._nvml
        self._not_available = {n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_NO_PERMISSION,
                               n.NVML_ERROR_NOT_FOUND, n.NVML_ERROR_FUNCTION_NOT_FOUND,
                               n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, n.NVML_ERROR_TIMEOUT}
        # Permanent answers: the same call will never work on this GPU and driver.
        self._never = {n.NVML_ERROR_NOT_SUPPORTED, n.NVML_ERROR_NO_PERMISSION,
                       n.NVML_ERROR_FUNCTION_NOT_FOUND, n.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
        self._lost_codes = {n.NVML_ERROR_GPU_IS_LOST, n.NVML_ERROR_RESET_REQUIRED}
        self._warned: set = set()
        self._closed = False
        # PCIe counters: read in every tick until they cost too much of it, then only by
        # sample_pcie() (the sampler's slower job), the ticks reusing its newest values.
        self.pcie_separate = False
        self.last_sample_s = self.last_pcie_s = 0.0
        self._pcie_s = 0.0
        self._pcie_shares: list[float] | None = []  # share of each tick until the decision
        self._pcie: dict[int, tuple[int | None, int | None]] = {}
        count = self._init_library()
        self._gpus: list[_Gpu] = []
        self.static: list[GpuStatic] = []
        driver = _text(self._call(None, "nvmlSystemGetDriverVersion"))
        cuda = _cuda_version(self._call(None, "nvmlSystemGetCudaDriverVersion_v2")
                             or self._call(None, "nvmlSystemGetCudaDriverVersion"))
        for index in range(count):
            gpu = _Gpu(index, None)
            self._gpus.append(gpu)
            try:
                gpu.handle = self._call(gpu, "nvmlDeviceGetHandleByIndex", index)
                self.static.append(self._read_static(gpu, driver, cuda))
            except _GpuLost:
                gpu.lost = True
                # Lost before its facts could be read: uuid unknown (the column is NOT NULL).
                self.static.append(GpuStatic(index, "", None, None, None, None, None, driver, cuda))
        self._events = self._register_xid_events()

    def _init_library(self) -> int:
        """nvmlInit and the GPU count, or NvmlUnavailable saying why not."""
        n = self._nvml
        try:
            n.nvmlInit()
            return n.nvmlDeviceGetCount()
        except n.NVMLError as e:
            reasons = {
                n.NVML_ERROR_LIBRARY_NOT_FOUND:
                    "the NVIDIA driver library libnvidia-ml.so.1 was not found (no driver installed?)",
                n.NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
                n.NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
            }
            raise NvmlUnavailable(f"NVML unavailable: {reasons.get(e.value, f'nvmlInit failed: {e}')}") from None

    # -- the one wrapper ------------------------------------------------------------------------
    def _call(self, gpu: _Gpu | None, name: str, *args, key=None):
        """Call nvml.<name>(*args). None = not available; raises _GpuLost if the GPU is gone.

        `key` names the field for remembering "unsupported"; by default the function name and
        the arguments after the handle (clock type, ECC counter, ...).
        """
        key = key or (name, args[1:])
        if gpu is not None and key in gpu.unsupported:
            return None
        fn = getattr(self._nvml, name, None)
        if fn is None:  # an older nvidia-ml-py without this function
            if gpu is not None:
                gpu.unsupported.add(key)
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            if e.value in self._lost_codes:
                raise _GpuLost() from None
            if gpu is not None and e.value in self._never:
                gpu.unsupported.add(key)
            elif e.value not in self._not_available and (name, e.value) not in self._warned:
                self._warned.add((name, e.value))  # say it once, not every tick
                log.warning("NVML %s failed: %s (reading it as not available)", name, e)
            return None

    # -- static ---------------------------------------------------------------------------------
    def _read_static(self, gpu: _Gpu, driver: str | None, cuda: str | None) -> GpuStatic:
        h = gpu.handle
        pci = self._call(gpu, "nvmlDeviceGetPciInfo", h)
        mem = self._call(gpu, "nvmlDeviceGetMemoryInfo", h)
        power = (self._call(gpu, "nvmlDeviceGetEnforcedPowerLimit", h)
                 or self._call(gpu, "nvmlDeviceGetPowerManagementLimit", h))
        mig = self._call(gpu, "nvmlDeviceGetMigMode", h)
        return GpuStatic(
            gpu_index=gpu.index,
            uuid=_text(self._call(gpu, "nvmlDeviceGetUUID", h)) or "",
            name=_text(self._call(gpu, "nvmlDeviceGetName", h)),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            mem_total_bytes=mem.total if mem is not None else None,
            power_limit_mw=power,
            mig_mode=mig[0] if mig is not None else None,
            driver_version=driver,
            cuda_driver_version=cuda,
        )

    # -- per tick -------------------------------------------------------------------------------
    def sample(self, ts_ms: int) -> tuple[list[GpuSample], list[GpuProcessSample]]:
        started = time.perf_counter()
        self._pcie_s = 0.0
        gpu_samples: list[GpuSample] = []
        proc_samples: list[GpuProcessSample] = []
        for gpu in self._gpus:
            try:
                if gpu.lost:
                    self._recheck(gpu)
                sample = self._sample_gpu(gpu, ts_ms)
                procs = self._sample_processes(gpu, ts_ms)
            except _GpuLost:
                if not gpu.lost:
                    log.warning("GPU %d is lost (fell off the bus or needs a reset)", gpu.index)
                gpu.lost = True
                gpu_samples.append(GpuSample(gpu.index, ts_ms, state="lost"))
                continue
            gpu_samples.append(sample)
            proc_samples.extend(procs)
        self.last_sample_s, self.last_pcie_s = time.perf_counter() - started, self._pcie_s
        self._decide_pcie()
        return gpu_samples, proc_samples

    def _decide_pcie(self) -> None:
        if self._pcie_shares is None:
            return  # decided
        self._pcie_shares.append(self.last_pcie_s / max(self.last_sample_s, 1e-9))
        if len(self._pcie_shares) < PCIE_DECIDE_TICKS:
            return
        share = sorted(self._pcie_shares)[len(self._pcie_shares) // 2]
        self._pcie_shares = None
        if pcie_too_costly(share, 1.0):
            self.pcie_separate = True
            log.info("PCIe throughput counters take %.0f%% of a %.1f ms tick: read by their own "
                     "slower job from now on", 100 * share, self.last_sample_s * 1000)

    def sample_pcie(self) -> None:
        """Read every GPU's PCIe counters for the ticks to reuse (once pcie_separate)."""
        for gpu in self._gpus:
            if not gpu.lost:
                try:
                    self._pcie[gpu.index] = self._read_pcie(gpu)
                except _GpuLost:
                    pass  # the next tick marks it lost

    def _read_pcie(self, gpu: _Gpu) -> tuple[int | None, int | None]:
        n, started = self._nvml, time.perf_counter()
        tx = self._call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, n.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call(gpu, "nvmlDeviceGetPcieThroughput", gpu.handle, n.NVML_PCIE_UTIL_RX_BYTES)
        self._pcie_s += time.perf_counter() - started
        return tx, rx

    def _recheck(self, gpu: _Gpu) -> None:
        """Two cheap calls; raises _GpuLost while the GPU is still gone."""
        handle = self._call(gpu, "nvmlDeviceGetHandleByIndex", gpu.index)
        if handle is None or self._call(gpu, "nvmlDeviceGetUUID", handle) is None:
            raise _GpuLost()
        gpu.handle, gpu.lost = handle, False
        log.warning("GPU %d answers again", gpu.index)

    def _sample_gpu(self, gpu: _Gpu, ts_ms: int) -> GpuSample:
        n, h, call = self._nvml, gpu.handle, self._call
        util = call(gpu, "nvmlDeviceGetUtilizationRates", h)
        # v2 splits out what the driver reserves; drivers without it fail once, then v1 only.
        v2 = getattr(n, "nvmlMemory_v2", None)
        mem = (call(gpu, "nvmlDeviceGetMemoryInfo", h, v2) if v2 else None) \
            or call(gpu, "nvmlDeviceGetMemoryInfo", h)
        reasons = call(gpu, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:  # the name before driver 535
            reasons = call(gpu, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        pstate = call(gpu, "nvmlDeviceGetPerformanceState", h)
        pcie_tx, pcie_rx = self._pcie.get(gpu.index, (None, None)) if self.pcie_separate \
            else self._read_pcie(gpu)
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
            pcie_tx_kbps=pcie_tx,
            pcie_rx_kbps=pcie_rx,
            fan_pct=call(gpu, "nvmlDeviceGetFanSpeed", h),
            pstate=None if pstate == _PSTATE_UNKNOWN else pstate,
            throttle_reasons=reasons,
            ecc_corrected=call(gpu, "nvmlDeviceGetTotalEccErrors", h,
                               n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            ecc_uncorrected=call(gpu, "nvmlDeviceGetTotalEccErrors", h,
                                 n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
        )

    def _sample_processes(self, gpu: _Gpu, ts_ms: int) -> list[GpuProcessSample]:
        kinds: dict[int, list[str]] = defaultdict(list)
        mem: dict[int, int | None] = {}
        for kind, name in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                           ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
            used_by_pid: dict[int, int | None] = {}
            for p in self._call(gpu, name, gpu.handle) or ():
                used = p.usedGpuMemory
                used = None if used is None or used >= _NOT_AVAILABLE_U64 else used
                # A pid listed twice in one list (one entry per MIG instance): add them up.
                before = used_by_pid.get(p.pid)
                used_by_pid[p.pid] = used if before is None else before + (used or 0)
            for pid, used in used_by_pid.items():
                kinds[pid].append(kind)
                # Compute and graphics entries of one pid describe the same memory: keep the larger.
                known = [m for m in (mem.get(pid), used) if m is not None]
                mem[pid] = max(known) if known else None
        if not kinds:
            return []
        utils = self._process_utilisation(gpu)
        return [GpuProcessSample(gpu.index, pid, ts_ms, "+".join(kinds[pid]), mem[pid],
                                 *utils.get(pid, (None, None)))
                for pid in sorted(kinds)]

    def _process_utilisation(self, gpu: _Gpu) -> dict[int, tuple[int, int]]:
        """Mean SM / memory utilisation per pid over the samples newer than the last tick's."""
        samples = self._call(gpu, "nvmlDeviceGetProcessUtilization", gpu.handle, gpu.last_util_us,
                             key="process_utilization")
        # Drivers may hand back the boundary sample again; count each sample once.
        fresh = [s for s in samples or () if s.timeStamp > gpu.last_util_us]
        if not fresh:
            return {}
        gpu.last_util_us = max(s.timeStamp for s in fresh)
        by_pid: dict[int, list] = defaultdict(list)
        for s in fresh:
            by_pid[s.pid].append(s)
        return {pid: (round(sum(s.smUtil for s in ss) / len(ss)),
                      round(sum(s.memUtil for s in ss) / len(ss)))
                for pid, ss in by_pid.items()}

    # -- XID events -----------------------------------------------------------------------------
    def _register_xid_events(self):
        xid = getattr(self._nvml, "nvmlEventTypeXidCriticalError", None)
        events = self._call(None, "nvmlEventSetCreate") if xid else None
        if events is None:
            return None
        for gpu in self._gpus:
            if gpu.lost:
                continue
            try:
                supported = self._call(gpu, "nvmlDeviceGetSupportedEventTypes", gpu.handle)
                if supported and supported & xid:
                    self._call(gpu, "nvmlDeviceRegisterEvents", gpu.handle, xid, events,
                               key="register_events")
            except _GpuLost:
                gpu.lost = True
        return events

    def xid_events(self, ts_ms: int) -> list[XidEvent]:
        """Critical XID errors since the last call; never waits (timeout 0)."""
        found: list[XidEvent] = []
        if self._events is None:
            return found
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
        if self._events is not None:
            try:
                self._call(None, "nvmlEventSetFree", self._events)
            except _GpuLost:
                pass
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

"""A fake `pynvml` (nvidia-ml-py) for tests and bench scripts, with no GPU or driver.

It has the real module's function names and signatures, NVML_* constants, error classes (built
the same way, so `except pynvml.NVMLError_NotSupported` behaves alike) and struct attribute
names, for the calls gpuwatch makes. Every GPU is named "... (simulated)".

Two ways to use it:

    import fake_pynvml
    nvml = fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=2)     # a module-like object
    collector = NvmlCollector(nvml)

    # for code that does `import pynvml` itself (a daemon under test, a bench script):
    fake_pynvml.configure(gpus=8, lost_after={3: 100})
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)

Options (FakeNvml(...) and configure(...) take the same):
    gpus            number of GPUs (8)
    name            GPU name, "NVIDIA H100 80GB HBM3 (simulated)"
    mem_total_bytes memory per GPU (80 GiB)
    unsupported     names of nvml functions that raise NVMLError_NotSupported: a set for every
                    GPU, or {gpu_index: set} for some
    lost_after      {gpu_index: n}: that GPU answers n device calls, then NVMLError_GpuIsLost
    init_error      None | "LibraryNotFound" | "DriverNotLoaded" | "NoPermission": nvmlInit raises
    procs           {gpu_index: [pid, ...]} compute processes (real or made-up pids)
    procs_per_gpu   n made-up compute pids per GPU (4_000_000 + ..., which no kernel hands out)
    graphics_procs  {gpu_index: [pid, ...]} graphics processes
    memory_v2       False: nvmlDeviceGetMemoryInfo(h, nvmlMemory_v2) fails as on old drivers
    clock           callable returning seconds since the epoch (time.time); every value varies
                    with it, so a test that sets the clock gets the same numbers each run
    xids            {gpu_index: [xid, ...]} critical XID events waiting in the event set
    mig             {gpu_index: [profile, ...]} MIG mode on for that GPU, one MIG device per
                    profile ("3g.40gb", "1g.10gb", ...), GPU instance ids 1, 2, ... and compute
                    instance 0; its processes (procs / procs_per_gpu) are spread over them in
                    turn. As on real drivers, such a GPU gives no utilisation (whole-GPU or
                    per-process) and neither do its MIG devices, unless mig_util=True.
    hang            {gpu_index: t}: from t seconds after the fake is made, every call on that
                    GPU blocks (as a hung GPU's do) until .set_hung(index, False)
    gpm             GPU indices with GPM (Hopper-style GPU performance metrics; none by
                    default): nvmlGpmQueryDeviceSupport says so, and nvmlGpmMetricsGet gives SM
                    activity = 80 % of the GPU's utilisation at the newer sample's time,
                    occupancy 40 %, tensor 50 %, DRAM 30 %. Other GPUs: not supported.
                    .gpm_buffers counts the GPM sample buffers allocated and not yet freed.

Inspect and steer it with: .calls (Counter by function name), .gpu_calls (Counter by
(function name, gpu index)), .util_timestamps[gpu_index] (each lastSeenTimeStamp passed to
nvmlDeviceGetProcessUtilization), .set_lost(index, lost=True), .set_procs(index, pids),
.add_xid(index, xid), .set_mig(index, profiles), .set_hung(index, hung=True),
.set_util(index, pct) (a fixed utilisation; None: the wave again), .set_throttle(index, mask)
(fixed clock-event reasons; None: from the utilisation again), .add_ecc(index, n=1) (n more
uncorrected ECC errors).
"""

from __future__ import annotations

import math
import string
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

GiB = 1024**3
FAKE_PID_BASE = 4_000_000  # above Linux's largest pid_max (2**22), so never a live process
UTIL_PERIOD_US = 500_000  # one per-process utilisation sample every half second
UTIL_BUFFER = 8  # samples the fake driver keeps per process, like NVML's ring buffer

# Constants, with the real module's names and values.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_MAX_MIG_DEVICES = 7  # what nvmlDeviceGetMaxMigDeviceCount reports on A100 / H100
NVML_NO_INSTANCE_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process off MIG
NVML_PSTATE_UNKNOWN = 32
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
nvmlMemory_v2 = 0x02000028
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlClocksEventReasonGpuIdle = 0x0000000000000001
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_MAX = 477
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_SUPPORT_VERSION = 1


class NVMLError(Exception):
    """Same construction as pynvml's: NVMLError(code) returns an instance of the code's subclass."""

    _valClassMapping: dict[int, type] = {}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


_ERROR_TEXT = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_TIMEOUT: "Timeout",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


def _extract_errors_as_classes() -> None:
    """NVML_ERROR_GPU_IS_LOST -> class NVMLError_GpuIsLost, exactly as pynvml names them."""
    module = sys.modules[__name__]
    for err_name in [n for n in dir(module) if n.startswith("NVML_ERROR_")]:
        class_name = "NVMLError_" + string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        value = getattr(module, err_name)

        def gen_new(val):
            def new(typ, *args):
                return NVMLError.__new__(typ, val)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(value)})
        cls.__module__ = __name__
        setattr(module, class_name, cls)
        NVMLError._valClassMapping[value] = cls


_extract_errors_as_classes()


# Structs: the attribute names of pynvml's ctypes structures.
@dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclass
class c_nvmlMemory_v2_t:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclass
class nvmlPciInfo_t:
    busId: bytes
    busIdLegacy: bytes
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int


@dataclass
class nvmlFriendlyObject:  # what nvmlDeviceGet*RunningProcesses returns per process
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = NVML_NO_INSTANCE_ID
    computeInstanceId: int = NVML_NO_INSTANCE_ID


@dataclass
class c_nvmlDeviceAttributes:
    multiprocessorCount: int
    sharedCopyEngineCount: int
    sharedDecoderCount: int
    sharedEncoderCount: int
    sharedJpegCount: int
    sharedOfaCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


@dataclass
class c_nvmlProcessUtilizationSample_t:
    pid: int
    timeStamp: int  # microseconds since the epoch
    smUtil: int
    memUtil: int
    encUtil: int
    decUtil: int


@dataclass
class c_nvmlEventData_t:
    device: object
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class c_nvmlGpmSupport_t:
    version: int = NVML_GPM_SUPPORT_VERSION
    isSupportedDevice: int = 0


@dataclass
class FakeGpmSample:
    """What nvmlGpmSampleAlloc hands out (an opaque pointer in pynvml): where and when taken."""

    gpu: int | None = None
    t: float | None = None
    freed: bool = False


@dataclass
class c_metricInfo_t:
    shortName: bytes | None = None
    longName: bytes | None = None
    unit: bytes | None = None


@dataclass
class c_nvmlGpmMetric_t:
    metricId: int = 0
    nvmlReturn: int = NVML_SUCCESS
    value: float = 0.0
    metricInfo: c_metricInfo_t = field(default_factory=c_metricInfo_t)


@dataclass
class c_nvmlGpmMetricsGet_t:
    version: int = 0
    numMetrics: int = 0
    sample1: FakeGpmSample | None = None
    sample2: FakeGpmSample | None = None
    metrics: list = field(default_factory=lambda: [c_nvmlGpmMetric_t() for _ in range(NVML_GPM_METRIC_MAX)])


# GPM metric -> its share of the GPU's utilisation in the fake: SM activity, occupancy, tensor
# and DRAM activity below "a kernel was running", as on a real GPU.
_GPM_SHARES = {
    NVML_GPM_METRIC_GRAPHICS_UTIL: 1.0,
    NVML_GPM_METRIC_SM_UTIL: 0.8,
    NVML_GPM_METRIC_SM_OCCUPANCY: 0.4,
    NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.5,
    NVML_GPM_METRIC_DRAM_BW_UTIL: 0.3,
}


@dataclass(frozen=True)
class FakeHandle:
    index: int


@dataclass(frozen=True)
class FakeMigHandle(FakeHandle):
    """A MIG device: `index` is its parent GPU's, `mig_index` its place under that GPU."""

    mig_index: int = 0


@dataclass
class FakeEventSet:
    gpus: set[int] = field(default_factory=set)


def _wave(t: float, gpu: int, period: float, lo: float, hi: float) -> int:
    """A smooth value between lo and hi that differs per GPU and moves with time."""
    return int(lo + (hi - lo) * (0.5 + 0.5 * math.sin(t * 2 * math.pi / period + gpu)))


class FakeNvml:
    """A module-like fake of pynvml; see the module docstring for the options."""

    def __init__(
        self,
        gpus=8,
        name="NVIDIA H100 80GB HBM3 (simulated)",
        mem_total_bytes=80 * GiB,
        unsupported=(),
        lost_after=None,
        init_error=None,
        procs=None,
        procs_per_gpu=0,
        graphics_procs=None,
        memory_v2=True,
        clock=time.time,
        xids=None,
        mig=None,
        mig_util=False,
        gpm=(),
        hang=None,
    ):
        self.gpu_count = gpus
        self.name = name
        self.mem_total_bytes = mem_total_bytes
        if isinstance(unsupported, dict):
            self.unsupported = {i: set(unsupported.get(i, ())) for i in range(gpus)}
        else:
            self.unsupported = {i: set(unsupported) for i in range(gpus)}
        self.lost_after = dict(lost_after or {})
        self.init_error = init_error
        self.procs = {i: list((procs or {}).get(i, ())) for i in range(gpus)}
        for i in range(gpus):
            self.procs[i] += [FAKE_PID_BASE + i * 100 + k for k in range(procs_per_gpu)]
        self.graphics_procs = {i: list((graphics_procs or {}).get(i, ())) for i in range(gpus)}
        self.memory_v2 = memory_v2
        self.clock = clock
        self.loaded_at = clock() - 3600
        self.xids = {i: deque((xids or {}).get(i, ())) for i in range(gpus)}
        self.mig = {i: list(profiles) for i, profiles in (mig or {}).items()}
        self.mig_util = mig_util
        self.gpm = set(gpm)
        self.gpm_buffers = 0
        self.lost: set[int] = set()
        self.initialized = False
        self.init_count = 0
        self.calls: Counter = Counter()
        self.gpu_calls: Counter = Counter()
        self.util_timestamps: dict[int, list[int]] = {i: [] for i in range(gpus)}
        made = time.monotonic()
        self.hang_from = {i: made + t for i, t in (hang or {}).items()}  # monotonic s
        self._released = {i: threading.Event() for i in range(gpus)}
        self.util_override: dict[int, int] = {}
        self.throttle_override: dict[int, int] = {}
        self.ecc_uncorrected = {i: 0 for i in range(gpus)}

    # Everything else (constants, error classes, structs) comes from the module itself.
    def __getattr__(self, attr):
        try:
            return globals()[attr]
        except KeyError:
            raise AttributeError(attr) from None

    # -- steering ---------------------------------------------------------------------------
    def set_lost(self, index: int, lost: bool = True) -> None:
        (self.lost.add if lost else self.lost.discard)(index)

    def set_hung(self, index: int, hung: bool = True) -> None:
        """Calls on the GPU block from now on; hung=False lets every blocked call return."""
        if hung:
            self._released[index] = threading.Event()
            self.hang_from[index] = time.monotonic()
        else:
            self.hang_from.pop(index, None)
            self._released[index].set()

    def set_util(self, index: int, pct: int | None) -> None:
        if pct is None:
            self.util_override.pop(index, None)
        else:
            self.util_override[index] = pct

    def set_throttle(self, index: int, mask: int | None) -> None:
        if mask is None:
            self.throttle_override.pop(index, None)
        else:
            self.throttle_override[index] = mask

    def add_ecc(self, index: int, n: int = 1) -> None:
        self.ecc_uncorrected[index] += n

    def set_procs(self, index: int, pids) -> None:
        self.procs[index] = list(pids)

    def add_xid(self, index: int, xid: int) -> None:
        self.xids[index].append(xid)

    def set_mig(self, index: int, profiles) -> None:
        """MIG devices created or destroyed (an empty list keeps MIG mode on with none)."""
        self.mig[index] = list(profiles)

    # -- internals --------------------------------------------------------------------------
    def _system(self, fn: str) -> None:
        self.calls[fn] += 1
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)

    def _device(self, fn: str, handle: FakeHandle) -> int:
        """Count the call and raise what the driver would for this GPU; returns its index."""
        self._system(fn)
        i = handle.index
        self.gpu_calls[fn, i] += 1
        if time.monotonic() >= self.hang_from.get(i, math.inf):
            self._released[i].wait()  # a hung GPU: the call returns only once released
        if i in self.lost_after:
            self.lost_after[i] -= 1
            if self.lost_after[i] < 0:
                self.lost.add(i)
                del self.lost_after[i]
        if i in self.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in self.unsupported[i]:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if isinstance(handle, FakeMigHandle):
            if handle.mig_index >= len(self.mig.get(i, ())):
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # a MIG device destroyed since
            if fn not in _MIG_HANDLE_CALLS and not (self.mig_util and fn in _UTIL_CALLS):
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        elif i in self.mig and fn in _UTIL_CALLS and not self.mig_util:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return i

    def _util(self, i: int, t: float | None = None) -> int:
        if i in self.util_override:
            return self.util_override[i]
        return _wave(self.clock() if t is None else t, i, 30.0, 5, 99) if self._pids(i) else 0

    def _pids(self, i: int) -> list[int]:
        return self.procs[i] + [p for p in self.graphics_procs[i] if p not in self.procs[i]]

    def _mig_pids(self, i: int, mig_index: int) -> list[int]:
        """The compute pids on one MIG device: a MIG GPU's pids go to its devices in turn."""
        return self.procs[i][mig_index :: len(self.mig[i])] if self.mig[i] else []

    def _mig_of(self, i: int, pid: int) -> int | None:
        return self.procs[i].index(pid) % len(self.mig[i]) if self.mig.get(i) else None

    def _process(self, i: int, pid: int, used: int | None) -> nvmlFriendlyObject:
        mig_index = self._mig_of(i, pid)
        if mig_index is None:
            return nvmlFriendlyObject(pid=pid, usedGpuMemory=used)
        return nvmlFriendlyObject(
            pid=pid, usedGpuMemory=used, gpuInstanceId=mig_index + 1, computeInstanceId=0
        )

    @staticmethod
    def _proc_mem(pid: int) -> int:
        return (1 + pid % 7) * GiB

    # -- system -----------------------------------------------------------------------------
    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        if self.init_error:
            raise NVMLError(
                globals()[
                    "NVML_ERROR_"
                    + {
                        "LibraryNotFound": "LIBRARY_NOT_FOUND",
                        "DriverNotLoaded": "DRIVER_NOT_LOADED",
                        "NoPermission": "NO_PERMISSION",
                    }[self.init_error]
                ]
            )
        self.initialized = True
        self.init_count += 1

    def nvmlShutdown(self):
        # As the real library: a reference count, so one user's shutdown leaves another's
        # handles working (`gpuwatch run` reads the UUIDs while its sampler runs).
        self._system("nvmlShutdown")
        self.init_count -= 1
        self.initialized = self.init_count > 0

    def nvmlSystemGetDriverVersion(self):
        self._system("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        self._system("nvmlSystemGetCudaDriverVersion_v2")
        return 12040

    def nvmlSystemGetCudaDriverVersion(self):
        self._system("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlDeviceGetCount(self):
        self._system("nvmlDeviceGetCount")
        return self.gpu_count

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < self.gpu_count:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._device("nvmlDeviceGetHandleByIndex", FakeHandle(index))
        return FakeHandle(index)

    # -- static facts -----------------------------------------------------------------------
    def nvmlDeviceGetIndex(self, handle):
        return self._device("nvmlDeviceGetIndex", handle)

    def nvmlDeviceGetName(self, handle):
        i = self._device("nvmlDeviceGetName", handle)
        if isinstance(handle, FakeMigHandle):  # as the driver names them, e.g. "... MIG 1g.10gb"
            base = self.name.removesuffix(" (simulated)")
            return f"{base} MIG {self.mig[i][handle.mig_index]} (simulated)"
        return self.name

    def nvmlDeviceGetUUID(self, handle):
        i = self._device("nvmlDeviceGetUUID", handle)
        if isinstance(handle, FakeMigHandle):
            return f"MIG-fa4e0000-0000-4000-9000-{i:06d}{handle.mig_index:06d}"
        return f"GPU-fa4e0000-0000-4000-8000-{i:012d}"

    def nvmlDeviceGetPciInfo(self, handle):
        i = self._device("nvmlDeviceGetPciInfo", handle)
        bus_id = f"00000000:{0x18 + i * 0x10:02X}:00.0".encode()
        return nvmlPciInfo_t(
            busId=bus_id,
            busIdLegacy=bus_id,
            domain=0,
            bus=0x18 + i * 0x10,
            device=0,
            pciDeviceId=0x233010DE,
            pciSubSystemId=0x16C110DE,
        )

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return 700_000

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        self._device("nvmlDeviceGetPowerManagementLimit", handle)
        return 700_000

    def nvmlDeviceGetMigMode(self, device):
        i = self._device("nvmlDeviceGetMigMode", device)
        mode = NVML_DEVICE_MIG_ENABLE if i in self.mig else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    # -- MIG --------------------------------------------------------------------------------
    def nvmlDeviceGetMaxMigDeviceCount(self, device):
        self._device("nvmlDeviceGetMaxMigDeviceCount", device)
        return NVML_MAX_MIG_DEVICES

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device, index):
        i = self._device("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if i not in self.mig:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= index < len(self.mig[i]):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return FakeMigHandle(i, index)

    def nvmlDeviceIsMigDeviceHandle(self, device):
        self._device("nvmlDeviceIsMigDeviceHandle", device)
        return int(isinstance(device, FakeMigHandle))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice):
        i = self._mig_device("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", migDevice)
        return FakeHandle(i)

    def nvmlDeviceGetGpuInstanceId(self, device):
        self._mig_device("nvmlDeviceGetGpuInstanceId", device)
        return device.mig_index + 1

    def nvmlDeviceGetComputeInstanceId(self, device):
        self._mig_device("nvmlDeviceGetComputeInstanceId", device)
        return 0

    def nvmlDeviceGetAttributes(self, device):
        i = self._device("nvmlDeviceGetAttributes", device)
        if isinstance(device, FakeMigHandle):
            slices, gb = _profile_size(self.mig[i][device.mig_index])
        else:
            slices, gb = 7, self.mem_total_bytes // GiB
        return c_nvmlDeviceAttributes(
            multiprocessorCount=16 * slices,
            sharedCopyEngineCount=slices,
            sharedDecoderCount=slices,
            sharedEncoderCount=0,
            sharedJpegCount=slices,
            sharedOfaCount=int(slices == 7),
            gpuInstanceSliceCount=slices,
            computeInstanceSliceCount=slices,
            memorySizeMB=gb * 1024,
        )

    def _mig_device(self, fn: str, handle) -> int:
        i = self._device(fn, handle)
        if not isinstance(handle, FakeMigHandle):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return i

    def _mig_mem_total(self, handle: FakeMigHandle) -> int:
        return _profile_size(self.mig[handle.index][handle.mig_index])[1] * GiB

    # -- per tick ---------------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        i = self._device("nvmlDeviceGetMemoryInfo", handle)
        reserved = 512 * 1024**2
        if isinstance(handle, FakeMigHandle):
            total, pids = self._mig_mem_total(handle), self._mig_pids(i, handle.mig_index)
        else:
            total, pids = self.mem_total_bytes, self._pids(i)
        used = min(sum(self._proc_mem(p) for p in pids), total - reserved)
        if not version:  # v1: "used" includes what the driver reserves
            return c_nvmlMemory_t(total=total, free=total - used - reserved, used=used + reserved)
        if not self.memory_v2:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        return c_nvmlMemory_v2_t(
            version=version, total=total, reserved=reserved, free=total - used - reserved, used=used
        )

    def nvmlDeviceGetUtilizationRates(self, handle):
        i = self._device("nvmlDeviceGetUtilizationRates", handle)
        util = self._util(i)
        return c_nvmlUtilization_t(gpu=util, memory=util // 2)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        i = self._device("nvmlDeviceGetTemperature", handle)
        return 30 + self._util(i) // 2

    def nvmlDeviceGetPowerUsage(self, handle):
        i = self._device("nvmlDeviceGetPowerUsage", handle)
        return 70_000 + self._util(i) * 6_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        i = self._device("nvmlDeviceGetTotalEnergyConsumption", handle)
        # mJ since the driver loaded (an hour before this fake was made), at about 300 W.
        return int((self.clock() - self.loaded_at) * (300_000 + 1_000 * i))

    def nvmlDeviceGetClockInfo(self, handle, type):
        i = self._device("nvmlDeviceGetClockInfo", handle)
        if type == NVML_CLOCK_MEM:
            return 2619
        return 345 + self._util(i) * 15

    def nvmlDeviceGetPcieThroughput(self, device, counter):
        i = self._device("nvmlDeviceGetPcieThroughput", device)
        return _wave(self.clock(), i + counter, 7.0, 0, 25_000_000) if self._pids(i) else 0

    def nvmlDeviceGetPersistenceMode(self, handle):
        self._device("nvmlDeviceGetPersistenceMode", handle)
        return NVML_FEATURE_ENABLED

    def nvmlDeviceGetFanSpeed(self, handle):
        i = self._device("nvmlDeviceGetFanSpeed", handle)
        return 30 + self._util(i) // 3

    def nvmlDeviceGetPerformanceState(self, handle):
        i = self._device("nvmlDeviceGetPerformanceState", handle)
        return 0 if self._util(i) else 8

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        i = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if i in self.throttle_override:
            return self.throttle_override[i]
        return (
            nvmlClocksEventReasonSwPowerCap
            if self._util(i) > 90
            else (0 if self._util(i) else nvmlClocksEventReasonGpuIdle)
        )

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        i = self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return 0 if self._util(i) else nvmlClocksEventReasonGpuIdle

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        i = self._device("nvmlDeviceGetTotalEccErrors", handle)
        return 3 if errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED else self.ecc_uncorrected[i]

    # -- processes --------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        i = self._device("nvmlDeviceGetComputeRunningProcesses", handle)
        # A MIG device lists its own processes; the parent lists all, with their instance ids.
        pids = self._mig_pids(i, handle.mig_index) if isinstance(handle, FakeMigHandle) else self.procs[i]
        return [self._process(i, p, self._proc_mem(p)) for p in pids]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        i = self._device("nvmlDeviceGetGraphicsRunningProcesses", handle)
        # Graphics contexts report no memory here, as under WDDM or on some drivers.
        return [nvmlFriendlyObject(pid=p, usedGpuMemory=None) for p in self.graphics_procs[i]]

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):
        """Samples newer than timeStamp (µs) from a short ring buffer; NOT_FOUND when none."""
        i = self._device("nvmlDeviceGetProcessUtilization", handle)
        self.util_timestamps[i].append(timeStamp)
        newest = int(self.clock() * 1e6) // UTIL_PERIOD_US * UTIL_PERIOD_US
        stamps = [newest - k * UTIL_PERIOD_US for k in range(UTIL_BUFFER)]
        samples = [
            c_nvmlProcessUtilizationSample_t(
                pid=p,
                timeStamp=ts,
                smUtil=_wave(ts / 1e6, p % 97, 30.0, 5, 99),
                memUtil=_wave(ts / 1e6, p % 89, 30.0, 1, 60),
                encUtil=0,
                decUtil=0,
            )
            for ts in sorted(stamps)
            if ts > timeStamp
            for p in self._pids(i)
        ]
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return samples

    # -- events -----------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        self._system("nvmlEventSetCreate")
        return FakeEventSet()

    def nvmlDeviceGetSupportedEventTypes(self, handle):
        self._device("nvmlDeviceGetSupportedEventTypes", handle)
        return nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        i = self._device("nvmlDeviceRegisterEvents", handle)
        if eventTypes & nvmlEventTypeXidCriticalError:
            eventSet.gpus.add(i)

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        self._system("nvmlEventSetWait_v2")
        for i in sorted(eventSet.gpus):
            if self.xids[i]:
                return c_nvmlEventData_t(
                    device=FakeHandle(i),
                    eventType=nvmlEventTypeXidCriticalError,
                    eventData=self.xids[i].popleft(),
                )
        raise NVMLError(NVML_ERROR_TIMEOUT)

    def nvmlEventSetWait(self, eventSet, timeoutms):
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet):
        self._system("nvmlEventSetFree")
        eventSet.gpus.clear()

    # -- GPM ----------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device):
        i = self._device("nvmlGpmQueryDeviceSupport", device)
        return c_nvmlGpmSupport_t(isSupportedDevice=int(i in self.gpm))

    def nvmlGpmSampleAlloc(self):
        self._system("nvmlGpmSampleAlloc")
        self.gpm_buffers += 1
        return FakeGpmSample()

    def nvmlGpmSampleFree(self, gpmSample):
        self._system("nvmlGpmSampleFree")
        if gpmSample.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpmSample.freed = True
        self.gpm_buffers -= 1

    def nvmlGpmSampleGet(self, device, gpmSample):
        i = self._device("nvmlGpmSampleGet", device)
        if i not in self.gpm:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        gpmSample.gpu, gpmSample.t = i, self.clock()
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet):
        self._system("nvmlGpmMetricsGet")
        first, second = metricsGet.sample1, metricsGet.sample2
        if first.gpu is None or first.gpu != second.gpu:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if "nvmlGpmMetricsGet" in self.unsupported[second.gpu]:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        util = self._util(second.gpu, second.t)
        for m in metricsGet.metrics[: metricsGet.numMetrics]:
            share = _GPM_SHARES.get(m.metricId)
            m.nvmlReturn = NVML_SUCCESS if share is not None else NVML_ERROR_NOT_SUPPORTED
            m.value = util * share if share is not None else 0.0
        return metricsGet


# Calls a MIG device handle answers; the rest (temperature, power, clocks, ...) are the whole
# GPU's and give NOT_SUPPORTED on one. Utilisation is NOT_SUPPORTED in MIG mode, on either.
_MIG_HANDLE_CALLS = frozenset(
    {
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetAttributes",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
        "nvmlDeviceIsMigDeviceHandle",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetComputeRunningProcesses",
    }
)
_UTIL_CALLS = frozenset({"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"})


def _profile_size(profile: str) -> tuple[int, int]:
    """'3g.40gb' -> (3 slices, 40 GiB)."""
    g, gb = profile.split(".")[-2:]
    return int(g.removesuffix("g")), int(gb.removesuffix("gb"))


# Module-level API: the same functions, on one configurable default fake.
_default = FakeNvml()


def configure(**options) -> FakeNvml:
    """Replace the fake behind the module-level functions; returns it for inspection."""
    global _default
    _default = FakeNvml(**options)
    return _default


def _delegate(name):
    def call(*args, **kwargs):
        return getattr(_default, name)(*args, **kwargs)

    call.__name__ = name
    return call


for _name in [n for n in vars(FakeNvml) if n.startswith("nvml")]:
    globals()[_name] = _delegate(_name)
del _name

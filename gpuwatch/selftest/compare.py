"""The judgements of `gpuwatch selftest`, as pure functions of plain values.

Every GPU-side check measures two figures at the same moment (gpuwatch's own and an independent
one: nvidia-smi, torch.cuda, wall time) and hands them here; nothing in this module touches a
GPU, so each comparison and its tolerance is unit-tested against recorded nvidia-smi output.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from dataclasses import dataclass
from typing import Callable

MiB = 1024 ** 2


@dataclass(frozen=True)
class Field:
    """One `nvidia-smi --query-gpu` field, the gpuwatch value it checks and how close it must be."""
    smi: str  # the query name
    ours: str  # key in the dict of gpuwatch's values for that GPU
    tolerance: str  # stated in the output
    agrees: Callable[[object, object], bool]  # (ours, theirs) -> within tolerance


def _within(absolute: float, relative: float = 0.0) -> Callable[[object, object], bool]:
    return lambda a, b: abs(a - b) <= max(absolute, relative * abs(b))


def _same(a, b) -> bool:
    return a == b


# nvidia-smi prints MiB, W and MHz; gpuwatch keeps bytes, mW and MHz. Utilisation, power and clocks
# move between the two reads (a few ms apart), so they get a band; static facts must be equal.
GPU_FIELDS = (
    Field("memory.total", "mem_total_mib", "±1 MiB", _within(1)),
    Field("memory.used", "mem_used_mib", "±32 MiB", _within(32)),
    Field("utilization.gpu", "gpu_util_pct", "±10 points", _within(10)),
    Field("utilization.memory", "mem_util_pct", "±10 points", _within(10)),
    Field("temperature.gpu", "temp_c", "±2 °C", _within(2)),
    Field("power.draw", "power_w", "±10 % or 15 W", _within(15, 0.10)),
    Field("clocks.sm", "sm_clock_mhz", "±5 % or 30 MHz", _within(30, 0.05)),
    Field("clocks.mem", "mem_clock_mhz", "±5 % or 30 MHz", _within(30, 0.05)),
    Field("persistence_mode", "persistence", "equal", _same),
    Field("mig.mode.current", "mig_mode", "equal", _same),
)
SMI_GPU_QUERY = ",".join(["uuid"] + [f.smi for f in GPU_FIELDS])
SMI_APPS_QUERY = "pid,gpu_uuid,used_memory"
_MISSING = {"", "n/a", "[n/a]", "[not supported]", "not supported", "[unknown error]", "[insufficient permissions]"}
_FLAGS = {"enabled": 1, "disabled": 0}


def smi_value(text: str):
    """One nvidia-smi CSV cell (--format=csv,noheader,nounits): a number, 1/0 for a flag, None if absent."""
    text = text.strip()
    low = text.lower()
    if low in _MISSING:
        return None
    if low in _FLAGS:
        return _FLAGS[low]
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_smi_csv(text: str, query: str) -> list[dict]:
    """Rows of `nvidia-smi --query-...=<query> --format=csv,noheader,nounits` as dicts by field name."""
    names = query.split(",")
    rows = []
    for cells in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not cells:
            continue
        if len(cells) != len(names):
            raise ValueError(f"nvidia-smi printed {len(cells)} fields where {len(names)} were asked: {cells!r}")
        rows.append({n: smi_value(c) for n, c in zip(names, cells)})
    return rows


def our_gpu_values(static, sample, persistence: int | None) -> dict:
    """gpuwatch's figures for one GPU (its GpuStatic and GpuSample) in nvidia-smi's units."""
    def mib(b):
        return None if b is None else b / MiB

    return {
        "mem_total_mib": mib(static.mem_total_bytes), "mem_used_mib": mib(sample.mem_used_bytes),
        "gpu_util_pct": sample.gpu_util_pct, "mem_util_pct": sample.mem_util_pct,
        "temp_c": sample.temp_c, "power_w": None if sample.power_mw is None else sample.power_mw / 1000,
        "sm_clock_mhz": sample.sm_clock_mhz, "mem_clock_mhz": sample.mem_clock_mhz,
        "persistence": persistence, "mig_mode": static.mig_mode,
    }


@dataclass(frozen=True)
class Verdict:
    name: str
    status: str  # ok | FAIL | skipped
    detail: str


def compare_gpu(label: str, ours: dict, smi_row: dict) -> list[Verdict]:
    """One verdict per field: ok within its tolerance, FAIL outside, skipped when either side lacks it."""
    out = []
    for f in GPU_FIELDS:
        a, b = ours.get(f.ours), smi_row.get(f.smi)
        name = f"{label} {f.smi}"
        if a is None and b is None:
            out.append(Verdict(name, "skipped", "not reported by this GPU (NVML nor nvidia-smi)"))
        elif a is None or b is None:
            side = "gpuwatch" if a is None else "nvidia-smi"
            out.append(Verdict(name, "FAIL", f"{side} has no value; other side: {b if a is None else a}"))
        else:
            ok = f.agrees(a, b)
            out.append(Verdict(name, "ok" if ok else "FAIL",
                               f"gpuwatch {_show(a)}, nvidia-smi {_show(b)} (tolerance {f.tolerance})"))
    return out


def _show(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def compare_process(pid: int, uuid: str, ours_mem_bytes: int | None, ours_user: str | None,
                    expected_user: str, apps: list[dict], at_least_bytes: int) -> list[Verdict]:
    """selftest's own CUDA process as gpuwatch saw it vs the --query-compute-apps rows."""
    theirs = [a for a in apps if a.get("pid") == pid and a.get("gpu_uuid") == uuid]
    out = []
    if not theirs:
        listed = sorted({a.get("pid") for a in apps})
        out.append(Verdict("process seen by nvidia-smi", "FAIL" if apps else "skipped",
                           f"pid {pid} not in nvidia-smi's compute apps {listed}" if apps else
                           "nvidia-smi lists no compute processes here (a container's PID namespace hides them)"))
    if ours_mem_bytes is None:
        out.append(Verdict("process pid", "FAIL", f"gpuwatch did not see pid {pid} on GPU {uuid}"))
        return out
    out.append(Verdict("process pid", "ok", f"pid {pid} on {uuid}"))
    out.append(Verdict("process user", "ok" if ours_user == expected_user else "FAIL",
                       f"gpuwatch {ours_user}, expected {expected_user}"))
    mib = ours_mem_bytes / MiB
    if theirs:
        smi_mib = theirs[0]["used_memory"]
        ok = smi_mib is not None and abs(mib - smi_mib) <= 2 and ours_mem_bytes >= at_least_bytes
        out.append(Verdict("process memory", "ok" if ok else "FAIL",
                           f"gpuwatch {mib:.0f} MiB, nvidia-smi {smi_mib} MiB, allocated "
                           f"{at_least_bytes / MiB:.0f} MiB (tolerance ±2 MiB, ≥ allocated)"))
    else:
        out.append(Verdict("process memory", "ok" if ours_mem_bytes >= at_least_bytes else "FAIL",
                           f"gpuwatch {mib:.0f} MiB ≥ the {at_least_bytes / MiB:.0f} MiB allocated"))
    return out


STEP_TOLERANCE = 0.02
SYNC_TOLERANCE = 0.05


def compare_step_times(event_ms: list[float], wall_ms: list[float]) -> Verdict:
    """CUDA-event step times vs synchronize()-bounded wall times of the same steps: ≤ 2 % apart."""
    if len(event_ms) != len(wall_ms) or not wall_ms:
        return Verdict("step timing", "FAIL", f"{len(event_ms)} event times for {len(wall_ms)} steps")
    total_e, total_w = sum(event_ms), sum(wall_ms)
    per_step = statistics.median(abs(e - w) / w for e, w in zip(event_ms, wall_ms))
    off = abs(total_e - total_w) / total_w
    ok = off <= STEP_TOLERANCE and per_step <= STEP_TOLERANCE
    return Verdict("step timing", "ok" if ok else "FAIL",
                   f"{len(wall_ms)} steps: events {total_e:.1f} ms vs wall {total_w:.1f} ms ({off:.2%} "
                   f"apart, median step {per_step:.2%}; tolerance {STEP_TOLERANCE:.0%})")


def compare_loop_times(tracked_s: float, untracked_s: float, sync_errors: int) -> Verdict:
    """The tracked loop may not wait for the GPU more than the untracked one does."""
    extra = tracked_s / untracked_s - 1
    ok = extra <= SYNC_TOLERANCE and sync_errors == 0
    return Verdict("no extra synchronize", "ok" if ok else "FAIL",
                   f"tracked {tracked_s * 1000:.1f} ms vs untracked {untracked_s * 1000:.1f} ms "
                   f"({extra:+.1%}, tolerance +{SYNC_TOLERANCE:.0%}); "
                   f"synchronising calls under torch's sync debug mode: {sync_errors}")


OOM_REQUEST_TOLERANCE = 0.01
OOM_MEMORY_TOLERANCE = 16 * MiB  # the caching allocator may round or release a block in between
_FITS = re.compile(r"L ≤ (\d+) fits")


def attention_oom_length(free_bytes: int, batch: int, heads: int, dtype_bytes: int) -> int:
    """A sequence length whose B·H·L² score tensor is a quarter larger than free memory."""
    return int((1.25 * free_bytes / (batch * heads * dtype_bytes)) ** 0.5) + 1


def advised_length(advice: list[dict]) -> int | None:
    """N from the postmortem advice's "L ≤ N fits", if given."""
    for item in advice:
        m = _FITS.search(item.get("detail", ""))
        if m:
            return int(m.group(1))
    return None


def compare_oom(pm: dict, batch: int, heads: int, seq_len: int, dtype_bytes: int,
                free_now: int, reserved_now: int) -> list[Verdict]:
    """The stored postmortem vs the arithmetic and torch.cuda's own figures right after the OOM."""
    expected = batch * heads * seq_len * seq_len * dtype_bytes
    requested = pm.get("requested_bytes")
    out = [Verdict("OOM requested", "ok" if requested and abs(requested - expected) <= max(
        OOM_REQUEST_TOLERANCE * expected, 2 * MiB) else "FAIL",
        f"postmortem {_mib(requested)} vs B·H·L²·bytes = {batch}·{heads}·{seq_len}²·{dtype_bytes} "
        f"= {_mib(expected)} (tolerance {OOM_REQUEST_TOLERANCE:.0%})")]
    for name, got, want, source in (("free", pm.get("free_bytes"), free_now, "torch.cuda.mem_get_info()"),
                                    ("reserved", pm.get("reserved_bytes"), reserved_now,
                                     "torch.cuda.memory_reserved()")):
        ok = got is not None and abs(got - want) <= OOM_MEMORY_TOLERANCE
        out.append(Verdict(f"OOM {name}", "ok" if ok else "FAIL",
                           f"postmortem {_mib(got)} vs {source} {_mib(want)} "
                           f"(tolerance {OOM_MEMORY_TOLERANCE // MiB} MiB)"))
    out.append(Verdict("OOM phase", "ok" if pm.get("phase") == "forward" else "FAIL",
                       f"postmortem says {pm.get('phase')!r}, the OOM was in forward"))
    return out


def _mib(b) -> str:
    return "-" if b is None else f"{b / MiB:,.0f} MiB"


_GPU_LINE = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG .*\(UUID: MIG-")


def mig_devices_by_gpu(listing: str) -> dict[str, int]:
    """GPU UUID -> number of MIG devices under it, from `nvidia-smi -L`."""
    counts: dict[str, int] = {}
    gpu = None
    for line in listing.splitlines():
        m = _GPU_LINE.match(line)
        if m:
            gpu = m.group(1)
            counts[gpu] = 0
        elif gpu is not None and _MIG_LINE.match(line):
            counts[gpu] += 1
    return counts


def missing_stats_keys(stats: dict, stored: tuple[str, ...]) -> list[str]:
    return [k for k in stored if k not in stats]


def matmul_device_times(ops: list[dict]) -> Verdict:
    """A profiled window of matmuls: its mm/matmul operators must carry non-zero device time."""
    mm = [o for o in ops if any(k in o["name"] for k in ("aten::mm", "aten::matmul", "aten::addmm", "gemm"))]
    timed = [o for o in mm if (o.get("device_total_us") or 0) > 0]
    ok = bool(mm) and len(timed) == len(mm)
    shown = ", ".join(f"{o['name']} {o.get('device_total_us') or 0:.0f} µs" for o in mm[:3]) or "none"
    return Verdict("profiler device times", "ok" if ok else "FAIL", f"matmul operators: {shown}")

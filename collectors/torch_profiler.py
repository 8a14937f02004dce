"""torch.profiler windows: start one, read its top operators, keep its Chrome trace gzipped.

torch is imported inside functions: importing this module costs nothing.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TOP_OPS = 50
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class OpStats:
    """One operator over a profiled window (times in microseconds, memory in bytes)."""

    name: str
    calls: int
    self_cpu_us: float
    cpu_total_us: float
    self_device_us: float | None  # None: the window recorded no device (CPU-only run)
    device_total_us: float | None
    self_mem_bytes: int


@dataclass(frozen=True)
class SavedTrace:
    path: Path | None  # None when the trace was dropped
    bytes: int | None  # gzipped size (also when dropped: how big it would have been)
    note: str | None  # why it was dropped


def safe_name(text: str, max_chars: int = 64) -> str:
    """A file name part that cannot leave its directory: no '/', no leading dots, bounded."""
    cleaned = _UNSAFE.sub("_", str(text)).strip("._")[:max_chars]
    return cleaned or "_"


def activities() -> list:
    import torch
    from torch.profiler import ProfilerActivity

    found = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        found.append(ProfilerActivity.CUDA)
    return found


def start(wait: int, warmup: int, active: int, repeat: int, on_ready: Callable) -> object:
    """A started torch.profiler.profile driven by its step(); on_ready(prof) after each window."""
    import warnings

    import torch.profiler as tp

    # Each window is reported on its own: that is the point, not a surprise worth a warning.
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events", category=UserWarning)
    prof = tp.profile(
        activities=activities(),
        profile_memory=True,
        on_trace_ready=on_ready,
        schedule=tp.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
    )
    prof.start()
    return prof


def top_ops(prof, limit: int = TOP_OPS) -> list[OpStats]:
    """The operators that cost most, by self device time then self CPU time."""
    # Without a device activity every device time is a meaningless 0: store "not measured".
    on_device = any(a.name != "CPU" for a in getattr(prof, "activities", ()))
    ops = []
    for e in prof.key_averages():
        ops.append(
            OpStats(
                name=e.key,
                calls=int(e.count),
                self_cpu_us=float(e.self_cpu_time_total),
                cpu_total_us=float(e.cpu_time_total),
                self_device_us=float(getattr(e, "self_device_time_total", 0.0) or 0.0) if on_device else None,
                device_total_us=float(getattr(e, "device_time_total", 0.0) or 0.0) if on_device else None,
                self_mem_bytes=int(
                    (e.self_cpu_memory_usage or 0) + (getattr(e, "self_device_memory_usage", 0) or 0)
                ),
            )
        )
    ops.sort(key=lambda o: (o.self_device_us or 0.0, o.self_cpu_us), reverse=True)
    return ops[:limit]


def save_trace(prof, directory: Path, stem: str, max_bytes: int) -> SavedTrace:
    """Export the Chrome trace as <stem>.json.gz (opens in Perfetto); drop it if over max_bytes."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    final = directory / f"{safe_name(stem)}.json.gz"
    raw = final.with_name(f".{final.name}.{os.getpid()}.json")
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    try:
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except BaseException:  # e.g. a full disk: no half-written trace left behind
        tmp.unlink(missing_ok=True)
        raise
    finally:
        raw.unlink(missing_ok=True)
    size = tmp.stat().st_size
    if size > max_bytes:
        tmp.unlink()
        return SavedTrace(
            None,
            size,
            f"trace dropped: {size / 2**20:.1f} MiB gzipped exceeds "
            f"profile_max_mb ({max_bytes / 2**20:.1f} MiB); top operators kept",
        )
    tmp.replace(final)
    return SavedTrace(final, size, None)

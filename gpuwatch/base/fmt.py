"""Human formatting shared by the CLI, the TUI and reports: sizes, durations, counts, sparklines.

Every function takes None (a figure nobody measured) and returns "-" for it, so callers never
branch on missing data.
"""

from __future__ import annotations

import math
import time
from typing import Iterable

MISSING = "-"
SPARK_BARS = "▁▂▃▄▅▆▇█"
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

# NVML clock-event ("throttle") reason bits worth telling a user about; idle and
# application-clock settings are normal operation, not throttling.
THROTTLE_REASONS = (
    (0x4, "power cap"),
    (0x8, "HW slowdown"),
    (0x10, "sync boost"),
    (0x20, "SW thermal"),
    (0x40, "HW thermal"),
    (0x80, "power brake"),
)


def throttle_words(mask: int | None) -> list[str]:
    """Decode an NVML clock-event reason bitmask into words: 0x44 -> ["power cap", "HW thermal"]."""
    return [word for bit, word in THROTTLE_REASONS if mask and mask & bit]


def size(n: float | None) -> str:
    """Bytes in binary units: 0 -> "0 B", 1536 -> "1.5 KiB", 3*2**30 -> "3.0 GiB"."""
    if n is None:
        return MISSING
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {_BYTE_UNITS[unit]}"


def duration(ms: float | None) -> str:
    """Milliseconds as the two largest units: 850 -> "850ms", 192000 -> "3m12s", "2h05m", "3d04h"."""
    if ms is None:
        return MISSING
    if ms < 0:
        return "-" + duration(-ms)
    if ms < 1000:
        return f"{ms:.0f}ms"
    secs = int(ms // 1000)
    if secs < 60:
        return f"{ms / 1000:.1f}s" if secs < 10 else f"{secs}s"
    mins, secs = divmod(secs, 60)
    if mins < 60:
        return f"{mins}m{secs:02d}s"
    hours, mins = divmod(mins, 60)
    if hours < 24:
        return f"{hours}h{mins:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def count(x: float | None) -> str:
    """A rate or count with an SI suffix and 3 significant figures: 12345 -> "12.3k"."""
    if x is None:
        return MISSING
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= limit:
            return f"{x / limit:.3g}{suffix}"
    return f"{x:.3g}" if x != int(x) else str(int(x))


def clip(text: str | None, width: int) -> str:
    """Text cut to width with an ellipsis: clip("python train.py", 8) -> "python …"."""
    text = MISSING if text is None else text
    return text if len(text) <= width else text[: width - 1] + "…"


def kwh(joules: float | None) -> str:
    """Energy in kWh, 3 significant figures: 14850 J -> "0.00413 kWh"."""
    return MISSING if joules is None else f"{joules / 3.6e6:.3g} kWh"


def joules_per_token(x: float | None) -> str:
    return MISSING if x is None else f"{x:.3g} J/token"


def percent(fraction: float | None) -> str:
    """0.423 -> "42.3%"."""
    return MISSING if fraction is None else f"{fraction * 100:.1f}%"


def gpu_label(
    gpu_index: int, gpu_instance_id: int | None = None, compute_instance_id: int | None = None
) -> str:
    """A GPU by its index, a MIG device as GPU/GI/CI (the ids of its legacy MIG-GPU-... UUID):
    0 -> "0", (1, 2, 0) -> "1/2/0"."""
    if gpu_instance_id is None:
        return str(gpu_index)
    return f"{gpu_index}/{gpu_instance_id}/{compute_instance_id}"


def gpu_state(state: str | None, since_ms: int | None = None) -> str:
    """A GPU's state in words: "ok", "lost", "not responding since 14:05:09"."""
    if state == "hung":
        return "not responding" + (f" since {local_time(since_ms, False)}" if since_ms else "")
    return state or "ok"


def local_time(ts_ms: int | None, with_date: bool = True) -> str:
    """Epoch ms as local time: "12-02 14:05:09" (or "14:05:09")."""
    if ts_ms is None:
        return MISSING
    return time.strftime("%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(ts_ms / 1000))


def sparkline(
    values: Iterable[float | None], width: int | None = None, lo: float | None = None, hi: float | None = None
) -> str:
    """Unicode bars scaled from the series' min to max (or fixed `lo`/`hi`, e.g. 0-100 for
    percentages, so a steady 99 % does not look like noise); missing values are spaces.

    With `width`, the series is averaged into that many buckets first (long runs still fit).
    """
    vals = list(values)
    if width is not None and len(vals) > width > 0:
        vals = _bucket_means(vals, width)
    present = [v for v in vals if v is not None and not math.isnan(v)]
    if not present:
        return " " * len(vals)
    lo = min(present) if lo is None else lo
    hi = max(present) if hi is None else hi
    span = hi - lo
    top = len(SPARK_BARS) - 1
    out = []
    for v in vals:
        if v is None or math.isnan(v):
            out.append(" ")
        elif span == 0:
            out.append(SPARK_BARS[top // 2])
        else:
            out.append(SPARK_BARS[min(top, max(0, round((v - lo) / span * top)))])
    return "".join(out)


def _bucket_means(vals: list[float | None], width: int) -> list[float | None]:
    out: list[float | None] = []
    n = len(vals)
    for b in range(width):
        chunk = [v for v in vals[b * n // width : (b + 1) * n // width] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out

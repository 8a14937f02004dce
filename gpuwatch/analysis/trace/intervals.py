"""Interval arithmetic over [start, end) pairs: merge, covered length, difference."""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable

Interval = tuple[float, float]


def merge(pairs: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of `pairs` (HTA's merge_kernel_intervals: touching ones join)."""
    out: list[list[float]] = []
    for ts, end in sorted(pairs):
        if out and ts <= out[-1][1]:
            if end > out[-1][1]:
                out[-1][1] = end
        else:
            out.append([ts, end])
    return [(a, b) for a, b in out]


def total(merged: list[Interval]) -> float:
    return sum(b - a for a, b in merged)


def covered(merged: list[Interval], lo: float, hi: float) -> float:
    """Length of [lo, hi) covered by the merged intervals."""
    if hi <= lo or not merged:
        return 0.0
    i = max(bisect_right(merged, (lo, float("inf"))) - 1, 0)
    got = 0.0
    while i < len(merged) and merged[i][0] < hi:
        a, b = merged[i]
        got += max(0.0, min(b, hi) - max(a, lo))
        i += 1
    return got


def intersect_total(a: list[Interval], b: list[Interval]) -> float:
    """Length of the intersection of two merged lists."""
    i = j = 0
    got = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            got += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return got


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of merged `a` not covered by merged `b`."""
    out: list[Interval] = []
    j = 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k, cur = j, lo
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def clip(merged: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in merged if b > lo and a < hi]

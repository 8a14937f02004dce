"""Which GPUs are free: from the last minutes of samples, never from one instant.

A GPU fits when its smallest free memory over the window is at least what was asked, its mean
utilisation over the window is at most the limit, and no other user's process held memory on
it during the window. Best first: most free memory, then least busy. Locally the window comes
from the store; fleet-wide from Prometheus (`*_over_time` over the same window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuwatch.fleet.prometheus import Prometheus
from gpuwatch.store.gpu_windows import gpu_windows

if TYPE_CHECKING:
    import sqlite3

MIB = 1024 * 1024


class NothingFits(Exception):
    """No GPU (or host with enough GPUs) fits; the message is one line saying why."""


@dataclass(frozen=True)
class Candidate:
    host: str | None  # None: this machine
    index: int
    free_bytes: int | None  # the least free memory seen in the window
    util_pct: float | None  # mean utilisation over the window
    users: tuple[str, ...] = ()  # users whose processes held memory in the window
    lost: bool = False

    def misfit(self, mem_bytes: int, max_util: float, me: str) -> str | None:
        """Why this GPU does not fit (a short phrase for counting), or None when it does."""
        if self.lost:
            return "lost"
        if self.free_bytes is None or self.free_bytes < mem_bytes:
            return "too little free memory"
        if self.util_pct is None or self.util_pct > max_util:
            return f"busy (utilisation > {max_util:g} %)"
        if any(u != me for u in self.users):
            return "another user's process"
        return None


def choose(
    candidates: list[Candidate], count: int, mem_bytes: int, max_util: float, me: str
) -> list[list[Candidate]]:
    """Groups of `count` fitting GPUs on one host each, the best host first (best GPUs first
    within a host). Raises NothingFits naming why each GPU was left out."""
    if not candidates:
        raise NothingFits("no GPU samples in the window: is the daemon running (or scraped)?")
    misfits: dict[str, int] = {}
    fitting: dict[str | None, list[Candidate]] = {}
    for c in candidates:
        why = c.misfit(mem_bytes, max_util, me)
        if why:
            misfits[why] = misfits.get(why, 0) + 1
        else:
            fitting.setdefault(c.host, []).append(c)

    def best(c: Candidate) -> tuple[int, float, int]:
        return -(c.free_bytes or 0), c.util_pct or 0.0, c.index

    groups = [sorted(gs, key=best)[:count] for gs in fitting.values() if len(gs) >= count]
    if not groups:
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(misfits.items(), key=lambda kv: -kv[1]))
        short = [f"{host or 'this host'} has {len(gs)}" for host, gs in fitting.items()]
        where = f"; fitting: {', '.join(short)}" if short else ""
        raise NothingFits(
            f"no {'host has ' + str(count) + ' GPUs that fit' if count > 1 else 'GPU fits'} "
            f"of {len(candidates)} seen ({why or 'none left out'}){where}"
        )
    groups.sort(key=lambda gs: (best(gs[-1])[:2], gs[0].host or ""))  # a host is as good as its worst pick
    return groups


def local_candidates(conn: sqlite3.Connection, since_ms: int) -> list[Candidate]:
    """This machine's GPUs over the window starting at since_ms, from the store."""
    return [
        Candidate(None, w.gpu_index, w.min_free_bytes, w.mean_util_pct, w.users, w.lost)
        for w in gpu_windows(conn, since_ms)
    ]


def fleet_candidates(prom: Prometheus, window_s: int) -> list[Candidate]:
    """Every GPU gpuwatch exports to Prometheus, over the last window_s seconds."""
    w = f"{int(window_s)}s"
    up, free, util, users = prom.query_many(
        [
            "gpuwatch_gpu_up",
            f"min_over_time(DCGM_FI_DEV_FB_FREE[{w}])",
            f"avg_over_time(DCGM_FI_DEV_GPU_UTIL[{w}])",
            f"max_over_time(gpuwatch_gpu_user_memory_bytes[{w}])",
        ]
    )

    def key(r: dict[str, Any]) -> tuple[str, str, str]:
        m = r["metric"]
        return m.get("instance", ""), m.get("Hostname", ""), m.get("gpu", "")

    free_by = {key(r): r["value"][1] for r in free}
    util_by = {key(r): r["value"][1] for r in util}
    users_by: dict[tuple[str, str, str], set[str]] = {}
    for r in users:
        users_by.setdefault(key(r), set()).add(r["metric"].get("user", "?"))
    out = []
    for r in up:  # only GPUs of gpuwatch targets scraped now; a dcgm-exporter's are not ours
        k = key(r)
        mib = free_by.get(k)
        out.append(
            Candidate(
                k[1] or k[0],
                int(k[2]),
                None if mib is None else round(mib * MIB),
                util_by.get(k),
                tuple(sorted(users_by.get(k, ()))),
                r["value"][1] == 0,
            )
        )
    return out

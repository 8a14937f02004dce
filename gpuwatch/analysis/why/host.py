"""Causes on the host: CPU saturation and the processes that took it (host_top_processes),
memory pressure (swapping, page cache, /dev/shm)."""

from __future__ import annotations

import sqlite3

from gpuwatch import fmt
from gpuwatch.analysis.why.gpu import Candidate
from gpuwatch.analysis.why.window import Window, mean

SATURATED_PCT = 75.0     # host CPU above this is contended
HOG_RISE_PCT = 50.0      # a process whose CPU rose by half a core or more
HOST_RISE_PCT = 15.0     # the host's CPU rose this many points into saturation
SWAPPING_BPS = 1 << 20   # 1 MiB/s in and out of swap
SWAP_FULL_BPS = 10 << 20 # swapping this fast (page faults waiting on disk) explains it all


def _top(conn: sqlite3.Connection, span: tuple[int, int]) -> tuple[int, dict[int, tuple]]:
    """(ticks, pid -> (mean CPU % over every tick, mean RSS over every tick, user, cmdline,
    first seen)); a tick without the process counts as 0, so a short visit weighs little."""
    ticks = conn.execute("SELECT count(DISTINCT ts_ms) FROM host_top_processes WHERE ts_ms BETWEEN ? AND ?",
                         span).fetchone()[0]
    rows = conn.execute("SELECT pid, total(cpu_pct), total(rss_bytes), max(user), max(cmdline), min(ts_ms) "
                        "FROM host_top_processes WHERE ts_ms BETWEEN ? AND ? GROUP BY pid", span)
    return ticks, ({r[0]: (r[1] / ticks, r[2] / ticks, *r[3:]) for r in rows} if ticks else {})


def _cores(conn: sqlite3.Connection, span: tuple[int, int]) -> float:
    """The host's cores, as the top processes' CPU over the host's CPU share (host_samples keeps
    no core count); at least the busiest tick's own sum."""
    rows = conn.execute(
        "SELECT t.total, h.cpu_pct FROM (SELECT ts_ms, total(cpu_pct) AS total FROM host_top_processes "
        "WHERE ts_ms BETWEEN ? AND ? GROUP BY ts_ms) t JOIN host_samples h "
        "ON h.ts_ms BETWEEN t.ts_ms - 1000 AND t.ts_ms + 1000", span).fetchall()
    estimates = sorted(total / cpu for total, cpu in rows if cpu and cpu >= 20)
    return max(estimates[len(estimates) // 2], 1.0) if estimates else 1.0


def cpu(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """Processes outside the run whose CPU rose while the host was saturated. A hog taking h of
    n cores leaves the run's CPU work (launches, data loading) n - h of them: time x n/(n-h)."""
    host_now = mean(c for (c,) in conn.execute("SELECT cpu_pct FROM host_samples WHERE ts_ms BETWEEN ? AND ?",
                                               w.span()))
    if host_now is None or host_now < SATURATED_PCT:
        return []
    host_was = mean(c for (c,) in conn.execute("SELECT cpu_pct FROM host_samples WHERE ts_ms BETWEEN ? AND ?",
                                               w.span(base=True)))
    _, now = _top(conn, w.span())
    _, was = _top(conn, w.span(base=True))
    cores = _cores(conn, w.span())
    out = []
    for pid, (pct, _rss, user, cmdline, first) in now.items():
        rise = pct - was.get(pid, (0.0,))[0]
        if pid in w.own_pids or rise < HOG_RISE_PCT:
            continue
        share = min(rise / 100 / cores, 0.9)
        out.append((share / (1 - share), dict(
            kind="host_cpu", pid=pid, user=user, command=cmdline,
            detail=f"from {fmt.local_time(first)} pid {pid} ({user or '?'}, {cmdline or '?'}) took "
                   f"{pct / 100:.1f} of the host's {cores:.0f} cores; host CPU {host_now:.0f} %"
                   + (f" (was {host_was:.0f} %)" if host_was is not None else ""))))
    if not out and host_was is not None and host_now - host_was >= HOST_RISE_PCT:
        # No top-process samples name the hog (older data, or it was spread over many small
        # processes): the host's own saturation, scaled by how much of the headroom it took.
        took = min((host_now - host_was) / max(100 - host_was, 1e-9), 1.0)
        out.append((w.extra * took, dict(kind="host_cpu", detail=f"host CPU {host_now:.0f} % (was {host_was:.0f} %); "
                                                                  "no sampled process took it alone")))
    return out


def _rates(conn: sqlite3.Connection, span: tuple[int, int]) -> dict:
    rows = conn.execute("SELECT ts_ms, swap_in_bytes, swap_out_bytes, page_cache_bytes, shm_used_bytes, "
                        "shm_total_bytes FROM host_samples WHERE ts_ms BETWEEN ? AND ? ORDER BY ts_ms",
                        span).fetchall()
    swap = [(t, i + o) for t, i, o, *_ in rows if i is not None and o is not None]
    bps = ((swap[-1][1] - swap[0][1]) * 1000 / (swap[-1][0] - swap[0][0])
           if len(swap) > 1 and swap[-1][0] > swap[0][0] else None)
    return dict(swap_bps=bps, cache=mean(r[3] for r in rows),
                shm=max(((r[4] or 0) / r[5] for r in rows if r[5]), default=None))


def memory(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """Swapping: a step whose memory is swapped out waits on the disk. Blamed on the process
    outside the run whose resident memory grew the most, when there is one."""
    now, was = _rates(conn, w.span()), _rates(conn, w.span(base=True))
    rate = now["swap_bps"]
    if rate is None or rate < SWAPPING_BPS or rate < 4 * (was["swap_bps"] or 0):
        return []
    words = [f"swapping {fmt.size(rate)}/s (was {fmt.size(was['swap_bps'] or 0)}/s)"]
    if now["cache"] is not None and was["cache"]:
        words.append(f"page cache {fmt.size(was['cache'])} -> {fmt.size(now['cache'])}")
    if now["shm"] is not None and now["shm"] >= 0.9:
        words.append(f"/dev/shm {now['shm'] * 100:.0f} % full")
    _, top_now = _top(conn, w.span())
    _, top_was = _top(conn, w.span(base=True))
    growth = sorted((rss - top_was.get(pid, (0, 0))[1], pid) for pid, (_, rss, *_r) in top_now.items()
                    if pid not in w.own_pids)
    fields: dict = {}
    if growth and growth[-1][0] > 0:
        grew, pid = growth[-1]
        _pct, rss, user, cmdline, _first = top_now[pid]
        fields = dict(pid=pid, user=user, command=cmdline)
        words.append(f"pid {pid} ({user or '?'}, {cmdline or '?'}) grew to {fmt.size(rss)} (+{fmt.size(grew)})")
    return [(w.extra * min(rate / SWAP_FULL_BPS, 1.0), dict(kind="host_swap", detail="; ".join(words), **fields))]

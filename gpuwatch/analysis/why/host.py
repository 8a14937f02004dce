"""Causes on the host: CPU saturation and the processes that took it (host_top_processes),
memory pressure (swapping, page cache, /dev/shm)."""

from __future__ import annotations

import math
import os
import sqlite3

from gpuwatch.analysis.why.gpu import Candidate
from gpuwatch.analysis.why.window import Window, mean
from gpuwatch.base import fmt

SATURATED_PCT = 75.0  # host CPU above this is contended
HOG_RISE_PCT = 25.0  # a program whose CPU rose by a quarter of a core or more
HOST_RISE_PCT = 15.0  # the host's CPU rose this many points into saturation (or its run queue 20 %)
SWAPPING_BPS = 1 << 20  # 1 MiB/s in and out of swap
SWAP_FULL_BPS = 10 << 20  # swapping this fast (page faults waiting on disk) explains it all


def _top(conn: sqlite3.Connection, span: tuple[int, int]) -> tuple[int, dict[int, tuple]]:
    """(ticks, pid -> (mean CPU % over every tick, mean RSS over every tick, user, cmdline,
    first seen)); a tick without the process counts as 0, so a short visit weighs little."""
    ticks = conn.execute(
        "SELECT count(DISTINCT ts_ms) FROM host_top_processes WHERE ts_ms BETWEEN ? AND ?", span
    ).fetchone()[0]
    rows = conn.execute(
        "SELECT pid, total(cpu_pct), total(rss_bytes), max(user), max(cmdline), min(ts_ms) "
        "FROM host_top_processes WHERE ts_ms BETWEEN ? AND ? GROUP BY pid",
        span,
    )
    return ticks, ({r[0]: (r[1] / ticks, r[2] / ticks, *r[3:]) for r in rows} if ticks else {})


def _cores(conn: sqlite3.Connection, span: tuple[int, int]) -> float:
    """The host's cores, as the top processes' CPU over the host's CPU share (host_samples keeps
    no core count); at least the busiest tick's own sum."""
    rows = conn.execute(
        "SELECT t.total, h.cpu_pct FROM (SELECT ts_ms, total(cpu_pct) AS total FROM host_top_processes "
        "WHERE ts_ms BETWEEN ? AND ? GROUP BY ts_ms) t JOIN host_samples h "
        "ON h.ts_ms BETWEEN t.ts_ms - 1000 AND t.ts_ms + 1000",
        span,
    ).fetchall()
    estimates = sorted(total / cpu for total, cpu in rows if cpu and cpu >= 20)
    return max(estimates[len(estimates) // 2], 1.0) if estimates else 1.0


def _host_cpu(conn: sqlite3.Connection, span: tuple[int, int]) -> float | None:
    return mean(
        c for (c,) in conn.execute("SELECT cpu_pct FROM host_samples WHERE ts_ms BETWEEN ? AND ?", span)
    )


def _run_queue(conn: sqlite3.Connection, span: tuple[int, int], mean_of_span: bool) -> float | None:
    """The host's runnable tasks over the span. load1 is a one-minute exponential average, so
    over a window it lags: the queue the window had is recovered from load1 at its two ends,
    L_end = L_start e^(-T/60) + Q (1 - e^(-T/60)). A steady span: the mean of load1."""
    if mean_of_span:
        return mean(
            v for (v,) in conn.execute("SELECT load1 FROM host_samples WHERE ts_ms BETWEEN ? AND ?", span)
        )
    ends = [
        conn.execute(
            "SELECT ts_ms, load1 FROM host_samples WHERE ts_ms <= ? AND load1 IS NOT NULL "
            "ORDER BY ts_ms DESC LIMIT 1",
            (t,),
        ).fetchone()
        for t in span
    ]
    if not all(ends) or ends[1][0] <= ends[0][0]:
        return None
    decay = math.exp(-(ends[1][0] - ends[0][0]) / 60_000)
    return (ends[1][1] - ends[0][1] * decay) / (1 - decay)


def _groups(top: dict[int, tuple]) -> dict[tuple, list[int]]:
    """Pids by (user, command line): four copies of one program are one hog."""
    out: dict[tuple, list[int]] = {}
    for pid, (_pct, _rss, user, cmdline, _first) in top.items():
        out.setdefault((user, cmdline), []).append(pid)
    return out


def cpu(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """Programs outside the run whose CPU rose while the host was saturated. A hog taking h of
    n cores leaves the run's CPU work (launches, data loading) n - h of them: time x n/(n-h)."""
    host_now = _host_cpu(conn, w.span())
    if host_now is None or host_now < SATURATED_PCT:
        return []
    host_was = _host_cpu(conn, w.span(base=True))
    ticks, now = _top(conn, w.span())
    _, was = _top(conn, w.span(base=True))
    cores = _cores(conn, w.span()) if ticks else float(os.cpu_count() or 1)
    was_text = f" (was {host_was:.0f} %)" if host_was is not None else ""
    out = []
    for (user, cmdline), pids in _groups(now).items():
        pids = [p for p in pids if p not in w.own_pids]
        pct = sum(now[p][0] for p in pids)
        rise = pct - sum(was.get(p, (0.0,))[0] for p in pids)
        if rise < HOG_RISE_PCT:
            continue
        pid = max(pids, key=lambda p: now[p][0])
        share = min(rise / 100 / cores, 0.9)
        who = f"pid {pid}" if len(pids) == 1 else f"{len(pids)} processes (pid {pid}, ...)"
        out.append(
            (
                share / (1 - share),
                dict(
                    kind="host_cpu",
                    pid=pid,
                    user=user,
                    command=cmdline,
                    detail=f"from {fmt.local_time(min(now[p][4] for p in pids))} {who} ({user or '?'}, {cmdline or '?'}) "
                    f"took {pct / 100:.1f} of the host's {cores:.0f} cores; host CPU {host_now:.0f} %{was_text}",
                ),
            )
        )
    if out or host_was is None:
        return out
    # No sampled process names the hog (no top-process samples, or many small processes): the
    # host's saturation itself. A runnable process gets n/queue of a core once the run queue
    # is longer than n cores, so a longer queue stretches CPU work by queue_now/queue_was.
    took = min(max(host_now - host_was, 0) / max(100 - host_was, 1e-9), 1.0)
    q_now, q_was = _run_queue(conn, w.span(), False), _run_queue(conn, w.span(base=True), True)
    longer = max(q_now, cores) / max(q_was, cores) if q_now and q_was else 1.0
    if host_now - host_was < HOST_RISE_PCT and longer < 1.2:
        return []
    queue_text = f"; run queue {q_was:.1f} -> {q_now:.1f} on {cores:.0f} cores" if q_now and q_was else ""
    return [
        (
            max(w.extra * took, longer - 1),
            dict(
                kind="host_cpu",
                detail=f"host CPU {host_now:.0f} %{was_text}{queue_text}; no sampled process took it alone",
            ),
        )
    ]


def _rates(conn: sqlite3.Connection, span: tuple[int, int]) -> dict:
    rows = conn.execute(
        "SELECT ts_ms, swap_in_bytes, swap_out_bytes, page_cache_bytes, shm_used_bytes, "
        "shm_total_bytes FROM host_samples WHERE ts_ms BETWEEN ? AND ? ORDER BY ts_ms",
        span,
    ).fetchall()
    swap = [(t, i + o) for t, i, o, *_ in rows if i is not None and o is not None]
    bps = (
        (swap[-1][1] - swap[0][1]) * 1000 / (swap[-1][0] - swap[0][0])
        if len(swap) > 1 and swap[-1][0] > swap[0][0]
        else None
    )
    return dict(
        swap_bps=bps,
        cache=mean(r[3] for r in rows),
        shm=max(((r[4] or 0) / r[5] for r in rows if r[5]), default=None),
    )


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
    growth = sorted(
        (rss - top_was.get(pid, (0, 0))[1], pid)
        for pid, (_, rss, *_r) in top_now.items()
        if pid not in w.own_pids
    )
    fields: dict = {}
    if growth and growth[-1][0] > 0:
        grew, pid = growth[-1]
        _pct, rss, user, cmdline, _first = top_now[pid]
        fields = dict(pid=pid, user=user, command=cmdline)
        words.append(
            f"pid {pid} ({user or '?'}, {cmdline or '?'}) grew to {fmt.size(rss)} (+{fmt.size(grew)})"
        )
    return [
        (w.extra * min(rate / SWAP_FULL_BPS, 1.0), dict(kind="host_swap", detail="; ".join(words), **fields))
    ]

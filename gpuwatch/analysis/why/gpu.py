"""Causes on the run's GPUs: other processes that came onto them, and the GPUs' own state
(throttling, clock drop, power at its cap, heat, XID/ECC errors, not responding)."""

from __future__ import annotations

import sqlite3

from gpuwatch.analysis.why.window import Window, mean
from gpuwatch.base import fmt
from gpuwatch.base.fmt import THROTTLE_REASONS

# Clock-event reasons that slow a busy GPU down (sync boost does not).
SLOWING = [(bit, word) for bit, word in THROTTLE_REASONS if word != "sync boost"]
SLOWING_MASK = sum(bit for bit, _ in SLOWING)
PRESENT = 0.3  # a co-tenant is there for at least this share of the window's process ticks
SM_UNKNOWN = 0.5  # a co-tenant's SM share when NVML gives none
Candidate = tuple[float, dict]  # (extra time per unit it would cause, Cause fields but share)


def _process(conn: sqlite3.Connection, pid: int, ts_ms: int) -> tuple:
    """(user, cmdline, run_id) of the process with this pid around ts_ms."""
    row = conn.execute(
        "SELECT user, cmdline, run_id FROM processes WHERE pid = ? ORDER BY abs(first_seen_ms - ?) LIMIT 1",
        (pid, ts_ms),
    ).fetchone()
    return row or (None, None, None)


def _presence(conn: sqlite3.Connection, gpu: int, span: tuple[int, int]) -> dict[int, tuple]:
    """pid -> (share of the GPU's process ticks it was in, mean SM %, max memory, first seen)."""
    ticks = conn.execute(
        "SELECT count(DISTINCT ts_ms) FROM gpu_process_samples WHERE gpu_index = ? AND ts_ms BETWEEN ? AND ?",
        (gpu, *span),
    ).fetchone()[0]
    if not ticks:
        return {}
    rows = conn.execute(
        "SELECT pid, count(*), avg(sm_util_pct), max(used_mem_bytes), min(ts_ms) "
        "FROM gpu_process_samples WHERE gpu_index = ? AND ts_ms BETWEEN ? AND ? GROUP BY pid",
        (gpu, *span),
    )
    return {pid: (n / ticks, sm, mem, first) for pid, n, sm, mem, first in rows}


def cotenants(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """Processes of other runs or users that appeared on the run's GPUs in the slow window.
    Time-sharing a GPU with one using a share u of its SMs stretches the run's time by 1/(1-u)."""
    out = []
    for gpu in w.gpus:
        before = _presence(conn, gpu, w.span(base=True))
        for pid, (share, sm, mem, first) in _presence(conn, gpu, w.span()).items():
            if pid in w.own_pids or share < PRESENT:
                continue
            was_share, was_sm = before.get(pid, (0.0, None))[:2]
            rose = was_share < PRESENT or (sm is not None and (sm - (was_sm or 0)) >= 20)
            if not rose:
                continue
            u = min(sm / 100 if sm is not None else SM_UNKNOWN, 0.9)
            user, cmdline, run_id = _process(conn, pid, first)
            sm_text = f"SM {sm:.0f} %" if sm is not None else "SM % not reported"
            out.append(
                (
                    share * u / (1 - u),
                    dict(
                        kind="gpu_cotenant",
                        pid=pid,
                        user=user,
                        command=cmdline,
                        gpu_index=gpu,
                        detail=f"from {fmt.local_time(first)} pid {pid} ({user or '?'}, {cmdline or '?'}) on GPU {gpu}: "
                        f"{fmt.size(mem)}, {sm_text}, {share * 100:.0f} % of the window"
                        + (f" (run {run_id})" if run_id else ""),
                    ),
                )
            )
    return out


def _gpu_figures(conn: sqlite3.Connection, gpu: int, span: tuple[int, int]) -> dict:
    rows = conn.execute(
        "SELECT throttle_reasons, sm_clock_mhz, power_mw, temp_c, ecc_uncorrected, state "
        "FROM gpu_samples WHERE gpu_index = ? AND ts_ms BETWEEN ? AND ?",
        (gpu, *span),
    ).fetchall()
    n = len(rows) or 1
    reasons = {word: sum(1 for r in rows if r[0] and r[0] & bit) / n for bit, word in SLOWING}
    return dict(
        n=len(rows),
        slowed=sum(1 for r in rows if r[0] and r[0] & SLOWING_MASK) / n,
        reasons=reasons,
        clock=mean(r[1] for r in rows),
        power=mean(r[2] for r in rows),
        temp=max((r[3] for r in rows if r[3] is not None), default=None),
        ecc=max((r[4] for r in rows if r[4] is not None), default=None),
        bad=sum(1 for r in rows if r[5]) / n,
    )


def gpu_state(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """Throttling and clock drops (a compute-bound step takes clock_before / clock_now as long)
    and faults (XID, uncorrected ECC, a GPU lost or not responding: they explain it all)."""
    out = []
    limits = dict(conn.execute("SELECT gpu_index, power_limit_mw FROM gpus"))
    for gpu in w.gpus:
        now, was = _gpu_figures(conn, gpu, w.span()), _gpu_figures(conn, gpu, w.span(base=True))
        xids = [
            x
            for (x,) in conn.execute(
                "SELECT DISTINCT xid FROM xid_events WHERE gpu_index = ? AND ts_ms BETWEEN ? AND ?",
                (gpu, *w.span()),
            )
        ]
        ecc_rose = now["ecc"] is not None and now["ecc"] > (was["ecc"] or 0)
        if xids or ecc_rose or now["bad"] >= PRESENT:
            what = [f"XID {', '.join(map(str, xids))}"] if xids else []
            what += ["uncorrected ECC errors"] if ecc_rose else []
            what += (
                [f"not responding or lost {now['bad'] * 100:.0f} % of the window"]
                if now["bad"] >= PRESENT
                else []
            )
            out.append(
                (w.extra, dict(kind="gpu_error", gpu_index=gpu, detail=f"GPU {gpu}: " + "; ".join(what)))
            )
            continue
        if not now["n"]:
            continue
        clock_ratio = (was["clock"] / now["clock"]) if was["clock"] and now["clock"] else None
        more_slowed = now["slowed"] - was["slowed"]
        if more_slowed < PRESENT and (clock_ratio is None or clock_ratio < 1.1):
            continue
        expected = clock_ratio - 1 if clock_ratio and clock_ratio > 1 else max(more_slowed, 0) * w.extra
        words = [
            f"{word} {share * 100:.0f} % of the time"
            for word, share in now["reasons"].items()
            if share >= 0.1
        ]
        if clock_ratio and clock_ratio >= 1.05:
            words.append(f"SM clock {was['clock']:.0f} -> {now['clock']:.0f} MHz")
        limit = limits.get(gpu)
        if limit and now["power"] and now["power"] >= 0.95 * limit:
            words.append(f"power {now['power'] / 1000:.0f} W at its {limit / 1000:.0f} W cap")
        if now["temp"] is not None:
            words.append(f"up to {now['temp']} °C")
        out.append(
            (expected, dict(kind="gpu_throttle", gpu_index=gpu, detail=f"GPU {gpu}: " + ", ".join(words)))
        )
    return out

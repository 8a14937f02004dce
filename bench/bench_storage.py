"""Storage cost of the raw tier and the rollups: prints figures, asserts nothing.

Simulates an 8-GPU server sampled at 1 Hz with 50 GPU processes, written tick by tick through
the real Writer, for --hours hours (default 2), then rolls up with maintain() and measures each
table with SQLite's dbstat. Per-day figures are the measured per-tick cost times 86400.

Goals: <= 3 bytes per metric-sample in the raw tier, <= 100 MB/day, rollups <= 1 % of raw.

    .venv/bin/python bench/bench_storage.py [--hours 2] [--db /tmp/bench.db]
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path

from gpuwatch.store import Writer
from gpuwatch.store.maintenance import maintain

GPUS, PROCS, DAY_S = 8, 50, 86_400
RAW = ("gpu_samples", "gpu_process_samples", "host_samples", "daemon_stats")
KEYS = {"gpu_samples": 2, "gpu_process_samples": 3, "host_samples": 1, "daemon_stats": 1}
TIERS = ("gpu_samples_1m", "host_samples_1m", "gpu_samples_1h", "host_samples_1h")
MEM_TOTAL = 80 * 2**30


def tick_rows(rng: random.Random, t: int, ts: int, energy: list[int], lean: bool):
    gpus = []
    for g in range(GPUS):
        used = 60 * 2**30 + rng.randrange(2**30)
        power = rng.randrange(250_000, 700_000)
        energy[g] += power // 1000  # mJ over one second
        gpus.append({
            "gpu_index": g, "ts_ms": ts, "gpu_util_pct": rng.randrange(101),
            "mem_util_pct": rng.randrange(101), "mem_used_bytes": used,
            "mem_free_bytes": MEM_TOTAL - used, "mem_reserved_bytes": 530 * 2**20,
            "temp_c": rng.randrange(40, 80), "power_mw": power, "energy_mj": energy[g],
            "sm_clock_mhz": rng.choice((1755, 1980)), "mem_clock_mhz": 2619,
            "pcie_tx_kbps": rng.randrange(10**6), "pcie_rx_kbps": rng.randrange(10**6),
            "fan_pct": None,  # SXM boards have no fan: NVML says not supported
            "pstate": 0, "throttle_reasons": rng.choice((0, 0, 0, 4)),
            "ecc_corrected": 0, "ecc_uncorrected": 0, "state": None,
        })
    procs = [{
        "gpu_index": p % GPUS, "pid": 10_000 + p, "ts_ms": ts, "kind": "compute",
        "used_mem_bytes": (p + 1) * 2**28 + rng.randrange(2**24),
        "sm_util_pct": rng.randrange(101), "mem_util_pct": rng.randrange(101),
        "rss_bytes": 4 * 2**30 + rng.randrange(2**26), "cpu_pct": round(rng.uniform(0, 200), 1),
    } for p in range(PROCS)]
    if lean:  # what the writers could do: whole-percent CPU (a REAL column then stores a
        for proc in procs:  # small integer, not 8 bytes), and no repeated 'compute' text
            proc["cpu_pct"] = float(round(proc["cpu_pct"]))
            proc["kind"] = None
    host = {"ts_ms": ts, "cpu_pct": round(rng.uniform(0, 100), 1),
            "load1": round(rng.uniform(0, 64), 2), "load5": 20.0, "load15": 18.5,
            "mem_total_bytes": 2 * 2**40, "mem_used_bytes": 2**40 + rng.randrange(2**30),
            "mem_available_bytes": 2**40 - rng.randrange(2**30), "swap_used_bytes": 0,
            "disk_read_bytes": 10**12 + t * 10**6, "disk_write_bytes": 10**12 + t * 2 * 10**6,
            "net_rx_bytes": 10**13 + t * 10**7, "net_tx_bytes": 10**13 + t * 10**7,
            "shm_total_bytes": 2**40, "shm_used_bytes": 2**30}
    daemon = {"ts_ms": ts, "cpu_pct": round(rng.uniform(0, 2), 2), "rss_bytes": 60 * 2**20,
              "tick_ms": round(rng.uniform(2, 6), 3), "queue_depth": 0, "dropped_events": 0,
              "db_bytes": 0}
    return gpus, procs, host, daemon


def values_stored(conn: sqlite3.Connection, table: str) -> int:
    """Non-NULL values outside the primary key: what 'one metric-sample' means here."""
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if not r[5]]
    return conn.execute(f"SELECT {' + '.join(f'count({c})' for c in cols)} FROM {table}").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--db", default="")
    parser.add_argument("--lean", action="store_true",
                        help="whole-percent process cpu_pct and NULL kind, to measure those savings")
    args = parser.parse_args()
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="gw-bench-")) / "bench.db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")
    ticks = int(args.hours * 3600)
    rng = random.Random(1)
    energy = [10**9] * GPUS
    start_ts = 1_700_000_000_000 // 3_600_000 * 3_600_000
    writer = Writer(path)
    began = time.perf_counter()
    for t in range(ticks):
        gpus, procs, host, daemon = tick_rows(rng, t, start_ts + t * 1000, energy, args.lean)
        writer.insert("gpu_samples", gpus)
        writer.insert("gpu_process_samples", procs)
        writer.insert("host_samples", [host])
        writer.insert("daemon_stats", [daemon])
        if t % 600 == 0:
            writer.flush()  # commit in 1 Hz-like batches rather than one giant transaction
    writer.flush()
    write_s = time.perf_counter() - began
    now = start_ts + ticks * 1000 + 30_000
    began = time.perf_counter()
    report = []
    writer.submit(lambda conn: report.append(maintain(
        conn, now, raw_retention_ms=DAY_S * 1000, minute_retention_ms=14 * DAY_S * 1000,
        hour_retention_ms=365 * DAY_S * 1000, max_db_bytes=2**40)))
    writer.flush()
    maintain_s = time.perf_counter() - began
    writer.close()

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in RAW + TIERS}
    file_bytes = os.path.getsize(path)
    raw_bytes = sum(size.get(t, 0) for t in RAW)
    raw_values = sum(values_stored(conn, t) for t in RAW)
    per_day = DAY_S / ticks

    print(("[lean] " if args.lean else "") + f"simulated {ticks} ticks ({args.hours:g} h) of {GPUS} GPUs + {PROCS} GPU processes + host "
          f"+ daemon stats at 1 Hz; wrote in {write_s:.1f} s ({ticks / write_s:.0f} ticks/s), "
          f"maintain() took {maintain_s * 1000:.0f} ms: {report[0]}")
    print(f"{'table':<22}{'rows':>10}{'bytes':>12}{'B/row':>8}{'values':>11}{'B/value':>9}{'MB/day':>9}")
    for t in RAW:
        values = values_stored(conn, t)
        print(f"{t:<22}{rows[t]:>10}{size[t]:>12}{size[t] / max(rows[t], 1):>8.1f}{values:>11}"
              f"{size[t] / max(values, 1):>9.2f}{size[t] * per_day / 1e6:>9.1f}")
    print(f"raw tier: {raw_bytes / raw_values:.2f} bytes per metric-sample (non-key, non-NULL value); "
          f"{raw_bytes * per_day / 1e6:.1f} MB/day raw (file {file_bytes * per_day / 1e6:.1f} MB/day "
          f"incl. schema and rollups)  [goals: <= 3 B, <= 100 MB/day]")
    # Rollups: one day holds 1440 minute rows and 24 hour rows per key, whatever the sample rate.
    tier_day = 0.0
    for t in TIERS:
        period_rows_per_day = (1440 if t.endswith("1m") else 24) * (GPUS if t.startswith("gpu") else 1)
        # An hour row has the columns of a minute row; a few hours make too few to measure.
        minute_tier = t.replace("_1h", "_1m")
        per_row = size[minute_tier] / max(rows[minute_tier], 1)
        tier_day += per_row * period_rows_per_day
        print(f"{t:<22}{rows[t]:>10}{size[t]:>12}{per_row:>8.1f}  -> {per_row * period_rows_per_day / 1e6:.2f} MB/day")
    print(f"rollup tiers: {tier_day / 1e6:.2f} MB/day = {100 * tier_day / (raw_bytes * per_day):.2f} % of raw "
          f"[goal: <= 1 %]")
    conn.close()


if __name__ == "__main__":
    main()

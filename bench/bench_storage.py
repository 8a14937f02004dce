"""Storage cost of the raw tier and the rollups, as the real sampler writes them: prints figures.

Drives the real Sampler (8 simulated GPUs from tests/fake_pynvml.py, 50 GPU processes that are
real sleeping children, the real host collector, the real Writer) tick by tick at 1 Hz for
--hours hours (default a day) on an injected clock, with maintain() (rollups, retention) every
simulated minute as the daemon runs it, and measures each table with SQLite's dbstat. The raw
tier's day: bytes per value here times a day's values; the rollups' day: bytes per row times
a day's rows. (bench_queries.py times hand-written queries over such a day.)

Goals: <= 100 MB/day raw, rollups <= 1 % of raw.

    .venv/bin/python bench/bench_storage.py [--hours 24] [--db /tmp/bench.db]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import fake_pynvml  # noqa: E402  (the tests' fake NVML, not shipped in the package)

from gpuwatch.base.config import Config  # noqa: E402
from gpuwatch.monitor.sampler import Sampler  # noqa: E402
from gpuwatch.store import Writer  # noqa: E402
from gpuwatch.store.maintenance import maintain  # noqa: E402

GPUS, PROCS, DAY_S = 8, 50, 86_400
RAW = ("gpu_samples", "gpu_process_samples", "host_samples", "daemon_stats")
TIERS = ("gpu_samples_15m", "host_samples_15m", "gpu_samples_1h", "host_samples_1h")
# A sleeping stand-in has ~2 MB RSS (3-byte integer) and 0 % CPU (0 bytes); a trainer's
# GiB-scale RSS takes 6 bytes and a busy core's CPU % 1 byte: 4 bytes more per process row.
STAND_IN_SHORTFALL_B = 4


class Clock:
    """Injected time: ms for the Sampler, seconds for the fake NVML."""

    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> int:
        return self.ms

    def seconds(self) -> float:
        return self.ms / 1000


def values_stored(conn: sqlite3.Connection, table: str) -> int:
    """Non-NULL values outside the primary key: what 'one metric-sample' means here."""
    cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})") if not r[5]]
    return conn.execute(f"SELECT {' + '.join(f'count({c})' for c in cols)} FROM {table}").fetchone()[0]


def day_bytes(conn: sqlite3.Connection, size: dict, table: str, per_day: float) -> tuple[float, float]:
    """(bytes, values) of a day of the table's raw tier."""
    return size.get(table, 0) * per_day, values_stored(conn, table) * per_day


def simulate(path: Path, ticks: int, pids: list[int]) -> tuple[float, float, str]:
    clock = Clock(1_700_000_000_000 // 3_600_000 * 3_600_000)
    nvml = fake_pynvml.FakeNvml(gpus=GPUS, procs={g: pids[g::GPUS] for g in range(GPUS)}, clock=clock.seconds)
    writer = Writer(path)
    sampler = Sampler(writer, Config(db=str(path)), nvml_module=nvml, clock=clock)
    report = []

    # CPU seconds each maintain() took in the writer thread: its wall time here is mostly
    # waiting for the GIL, which this loop (a sampler ticking flat out) holds; a daemon's
    # sampler sleeps between ticks.
    spent = []

    def maintenance(now_ms: int) -> None:
        def job(conn: sqlite3.Connection) -> None:
            began = time.thread_time()
            report.append(
                maintain(
                    conn,
                    now_ms,
                    raw_retention_ms=DAY_S * 1000,
                    minute_retention_ms=14 * DAY_S * 1000,
                    hour_retention_ms=365 * DAY_S * 1000,
                    max_db_bytes=2**40,
                )
            )
            spent.append(time.thread_time() - began)

        writer.submit(job)

    began = time.perf_counter()
    for t in range(ticks):
        sampler.gpu_tick()
        sampler.host_tick()
        clock.ms += 1000
        if t % 60 == 59:
            maintenance(clock.ms)  # every minute, as the daemon's sampler does
        if t % 600 == 599:
            writer.flush()  # keep the queue short, as a 1 Hz daemon's would be
    writer.flush()
    write_s = time.perf_counter() - began
    began = time.perf_counter()
    maintenance(clock.ms + 30_000)
    writer.flush()
    maintain_s = time.perf_counter() - began
    nvml.nvmlShutdown()
    writer.close()
    return write_s, maintain_s, report[-1], spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--db", default="")
    args = parser.parse_args()
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="gw-bench-")) / "bench.db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")
    ticks = int(args.hours * 3600)
    sleepers = [subprocess.Popen(["sleep", "86400"]) for _ in range(PROCS)]
    try:
        write_s, maintain_s, report, spent = simulate(path, ticks, [p.pid for p in sleepers])
    finally:
        for p in sleepers:
            p.kill()
            p.wait()

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in RAW + TIERS}
    file_bytes = os.path.getsize(path)
    per_day = DAY_S / ticks
    day = {t: day_bytes(conn, size, t, per_day) for t in RAW}
    raw_day = sum(b for b, _ in day.values())
    raw_values_day = sum(v for _, v in day.values())

    print(
        f"real Sampler, {ticks} ticks ({args.hours:g} h) at 1 Hz on an injected clock: {GPUS} GPUs "
        f"(simulated) + {PROCS} GPU processes (sleeping stand-ins) + host; sampled, written and "
        f"maintained every minute in {write_s:.1f} s ({ticks / write_s:.0f} ticks/s), the last "
        f"maintain() took {maintain_s * 1000:.0f} ms: {report}"
    )
    print(
        f"maintain() every minute (rollups, retention), writer-thread CPU: mean "
        f"{1000 * mean(spent):.1f} ms, max {1000 * max(spent):.1f} ms = {100 * mean(spent) / 60:.3f} % of a core"
    )
    print(f"{'table':<28}{'rows':>9}{'bytes':>11}{'values':>10}{'B/value':>9}")
    for t in RAW:
        values = values_stored(conn, t)
        print(f"{t:<28}{rows[t]:>9}{size.get(t, 0):>11}{values:>10}{size.get(t, 0) / max(values, 1):>9.2f}")
    print("a day of the raw tier:")
    for t in RAW:
        print(f"  {t:<26}{day[t][0] / day[t][1]:>6.2f} B/value {day[t][0] / 1e6:>7.1f} MB/day")
    shortfall = rows["gpu_process_samples"] * STAND_IN_SHORTFALL_B * per_day / 1e6
    print(
        f"raw tier: {raw_day / raw_values_day:.2f} bytes per metric-sample (non-key, non-NULL value); "
        f"{raw_day / 1e6:.1f} MB/day raw (this run's file: {file_bytes / 1e6:.1f} MB)  "
        f"[goal: <= 100 MB/day]"
    )
    print(
        f"  with trainers' RSS and CPU % instead of sleepers' (+{STAND_IN_SHORTFALL_B} B per process "
        f"row): ~{raw_day / 1e6 + shortfall:.1f} MB/day raw"
    )
    # Rollups: one day holds 96 15-minute rows and 24 hour rows per key, whatever the sample rate.
    tier_day = 0.0
    for t in TIERS:
        period_rows_per_day = (96 if t.endswith("15m") else 24) * (GPUS if t.startswith("gpu") else 1)
        # An hour row has the columns of a 15-minute row; a few hours make too few to measure.
        fine_tier = t.replace("_1h", "_15m")
        per_row = size[fine_tier] / max(rows[fine_tier], 1)
        tier_day += per_row * period_rows_per_day
        print(
            f"{t:<22}{rows[t]:>10}{size[t]:>12}{per_row:>8.1f}  -> {per_row * period_rows_per_day / 1e6:.2f} MB/day"
        )
    print(
        f"rollup tiers: {tier_day / 1e6:.2f} MB/day = {100 * tier_day / raw_day:.2f} % of raw [goal: <= 1 %]"
    )
    conn.close()


if __name__ == "__main__":
    main()

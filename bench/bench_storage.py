"""Storage cost of the raw tier and the rollups, as the real sampler writes them: prints figures.

Drives the real Sampler (8 simulated GPUs from tests/fake_pynvml.py, 50 GPU processes that are
real sleeping children, the real host collector, the real Writer) tick by tick at 1 Hz for
--hours hours on an injected clock, then rolls up with maintain() and measures each table with
SQLite's dbstat. Per-day figures are the measured per-tick cost times 86400.

Goals: <= 3 bytes per metric-sample in the raw tier, <= 100 MB/day, rollups <= 1 % of raw.

    .venv/bin/python bench/bench_storage.py [--hours 1] [--db /tmp/bench.db]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import fake_pynvml  # noqa: E402  (the tests' fake NVML, not shipped in the package)

from gpuwatch.config import Config  # noqa: E402
from gpuwatch.sampler import Sampler  # noqa: E402
from gpuwatch.store import Writer  # noqa: E402
from gpuwatch.store.maintenance import maintain  # noqa: E402

GPUS, PROCS, DAY_S = 8, 50, 86_400
RAW = ("gpu_samples", "gpu_process_samples", "host_samples", "daemon_stats")
TIERS = ("gpu_samples_1m", "host_samples_1m", "gpu_samples_1h", "host_samples_1h")
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


def simulate(path: Path, ticks: int, pids: list[int]) -> tuple[float, float, str]:
    clock = Clock(1_700_000_000_000 // 3_600_000 * 3_600_000)
    nvml = fake_pynvml.FakeNvml(gpus=GPUS, procs={g: pids[g::GPUS] for g in range(GPUS)},
                                clock=clock.seconds)
    writer = Writer(path)
    sampler = Sampler(writer, Config(db=str(path)), nvml_module=nvml, clock=clock)
    began = time.perf_counter()
    for t in range(ticks):
        sampler.gpu_tick()
        sampler.host_tick()
        clock.ms += 1000
        if t % 600 == 599:
            writer.flush()  # keep the queue short, as a 1 Hz daemon's would be
    writer.flush()
    write_s = time.perf_counter() - began
    began = time.perf_counter()
    report = []
    writer.submit(lambda conn: report.append(maintain(
        conn, clock.ms + 30_000, raw_retention_ms=DAY_S * 1000,
        minute_retention_ms=14 * DAY_S * 1000, hour_retention_ms=365 * DAY_S * 1000,
        max_db_bytes=2**40)))
    writer.flush()
    maintain_s = time.perf_counter() - began
    nvml.nvmlShutdown()
    writer.close()
    return write_s, maintain_s, report[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--db", default="")
    args = parser.parse_args()
    path = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="gw-bench-")) / "bench.db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.remove(f"{path}{suffix}")
    ticks = int(args.hours * 3600)
    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(PROCS)]
    try:
        write_s, maintain_s, report = simulate(path, ticks, [p.pid for p in sleepers])
    finally:
        for p in sleepers:
            p.kill()
            p.wait()

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in RAW + TIERS}
    file_bytes = os.path.getsize(path)
    raw_bytes = sum(size.get(t, 0) for t in RAW)
    raw_values = sum(values_stored(conn, t) for t in RAW)
    per_day = DAY_S / ticks

    print(f"real Sampler, {ticks} ticks ({args.hours:g} h) at 1 Hz on an injected clock: {GPUS} GPUs "
          f"(simulated) + {PROCS} GPU processes (sleeping stand-ins) + host; sampled and written in "
          f"{write_s:.1f} s ({ticks / write_s:.0f} ticks/s), maintain() took {maintain_s * 1000:.0f} ms: "
          f"{report}")
    print(f"{'table':<22}{'rows':>10}{'bytes':>12}{'B/row':>8}{'values':>11}{'B/value':>9}{'MB/day':>9}")
    for t in RAW:
        values = values_stored(conn, t)
        print(f"{t:<22}{rows[t]:>10}{size[t]:>12}{size[t] / max(rows[t], 1):>8.1f}{values:>11}"
              f"{size[t] / max(values, 1):>9.2f}{size[t] * per_day / 1e6:>9.1f}")
    shortfall = rows["gpu_process_samples"] * STAND_IN_SHORTFALL_B * per_day / 1e6
    print(f"raw tier: {raw_bytes / raw_values:.2f} bytes per metric-sample (non-key, non-NULL value); "
          f"{raw_bytes * per_day / 1e6:.1f} MB/day raw (file {file_bytes * per_day / 1e6:.1f} MB/day "
          f"incl. schema and rollups)  [goals: <= 3 B, <= 100 MB/day]")
    print(f"  with trainers' RSS and CPU % instead of sleepers' (+{STAND_IN_SHORTFALL_B} B per process "
          f"row): ~{(raw_bytes * per_day / 1e6) + shortfall:.1f} MB/day raw")
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

"""Cost of energy per run (store/energy.py) over a day of raw samples: prints figures.

The database holds --hours (default 24) of 1 s samples of 8 GPUs with their energy counters
and 50 GPU processes (a process tick every 5 s), each process a run that lasted the whole
time, stored as the daemon leaves them (maintain() rolled up and packed everything older than
ten minutes). Timed: run_energy() of one run over its lifetime (what `gpuwatch show` and
`compare` do), of two runs at once, and the incremental fold of 15 s (what a /metrics scrape or
a TUI poll does once caught up). Each run's figure is checked against the counter's increase.

    .venv/bin/python bench/bench_energy.py [--hours 24] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from gpuwatch.store import insert_rows, open_ro, open_rw
from gpuwatch.store.energy import EnergyLedger, run_energy
from gpuwatch.store.maintenance import maintain

GPUS, PROCS = 8, 50
WATTS = 300
T0 = 1_700_000_000_000 // 3_600_000 * 3_600_000
DAY_MS = 86_400_000


def fill(path: Path, seconds: int) -> None:
    conn = open_rw(path)
    end = T0 + seconds * 1000
    insert_rows(
        conn,
        "gpus",
        [
            dict(
                gpu_index=i,
                uuid=f"GPU-{i}",
                name="NVIDIA H100 80GB HBM3 (simulated)",
                first_seen_ms=T0,
                last_seen_ms=end,
            )
            for i in range(GPUS)
        ],
    )
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id=f"r{p}",
                name=f"run {p}",
                uid=1000,
                user="alice",
                pid=10_000 + p,
                status="finished",
                started_ms=T0,
                ended_ms=end,
            )
            for p in range(PROCS)
        ],
    )
    insert_rows(
        conn,
        "processes",
        [
            dict(pid=10_000 + p, start_ms=T0 - 1000, run_id=f"r{p}", first_seen_ms=T0, last_seen_ms=end)
            for p in range(PROCS)
        ],
    )
    hour = 3600
    for h0 in range(0, seconds, hour):  # an hour at a time: bounded memory
        span = range(h0, min(seconds, h0 + hour))
        conn.execute("BEGIN")
        insert_rows(
            conn,
            "gpu_samples",
            [
                dict(
                    gpu_index=i,
                    ts_ms=T0 + s * 1000,
                    gpu_util_pct=90,
                    power_mw=WATTS * 1000,
                    energy_mj=s * WATTS * 1000,
                )
                for s in span
                for i in range(GPUS)
            ],
        )
        insert_rows(
            conn,
            "gpu_process_samples",
            [
                dict(
                    gpu_index=p % GPUS,
                    pid=10_000 + p,
                    ts_ms=T0 + s * 1000,
                    used_mem_bytes=2**30,
                    sm_util_pct=90,
                )
                for s in span
                if s % 5 == 0
                for p in range(PROCS)
            ],
        )
        conn.execute("COMMIT")
    for _ in range(seconds // 3600 + 3):  # rollups, then packing an hour per call, as the daemon does
        maintain(
            conn,
            end + 60_000,
            raw_retention_ms=2 * DAY_MS,
            minute_retention_ms=14 * DAY_MS,
            hour_retention_ms=365 * DAY_MS,
            max_db_bytes=2**40,
        )
    conn.close()


def timed(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - began)
    return best, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    seconds = int(args.hours * 3600)
    end = T0 + seconds * 1000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "energy.db"
        began = time.perf_counter()
        fill(path, seconds)
        print(
            f"{args.hours:g} h of {GPUS} GPUs and {PROCS} processes written and packed in "
            f"{time.perf_counter() - began:.0f} s ({path.stat().st_size / 2**20:.0f} MiB)"
        )
        conn = open_ro(path)
        one_s, one = timed(lambda: run_energy(conn, {"r0": (T0, end)}), args.repeat)
        two_s, two = timed(lambda: run_energy(conn, {"r0": (T0, end), "r9": (T0, end)}), args.repeat)

        def fold_15s():
            ledger = EnergyLedger(end - 60_000)
            ledger.fold(conn, end - 15_000)
            began = time.perf_counter()
            ledger.fold(conn, end)
            return time.perf_counter() - began

        fold_s = min(fold_15s() for _ in range(args.repeat))
        conn.close()
    # r0 shares GPU 0 with the processes p = 8, 16, ...: 7 of them in all; r9 GPU 1's 6 ... 7.
    sharers = {p: len(range(p % GPUS, PROCS, GPUS)) for p in (0, 9)}
    want = {p: WATTS * (seconds - 1) / sharers[p] for p in (0, 9)}
    err = max(abs(two[f"r{p}"].joules - want[p]) / want[p] for p in (0, 9))
    print(
        f"run_energy, one run over {args.hours:g} h: {one_s * 1000:.0f} ms "
        f"({one['r0'].kwh:.3f} kWh; expected {want[0] / 3.6e6:.3f})"
    )
    print(f"run_energy, two runs on two GPUs: {two_s * 1000:.0f} ms (largest error {err * 100:.2f} %)")
    print(f"incremental fold of 15 s (a scrape or TUI poll once caught up): {fold_s * 1000:.2f} ms")
    print(f"load average {os.getloadavg()[0]:.2f} (best of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Scrape latency of /metrics with 8 GPUs and 50 active runs (goal: p99 <= 50 ms).

Usage: .venv/bin/python bench/bench_metrics.py [--scrapes 500] [--steps 2000]
The database is filled first (1000 runs, 50 running, `--steps` steps each for the running ones),
then /metrics is fetched over HTTP as Prometheus would. Prints p50/p99/max in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpuwatch.daemon.metrics import start_metrics_server
from gpuwatch.store import insert_rows, now_ms, open_rw

GIB = 1024 ** 3


def fill(path: Path, steps: int) -> None:
    ts = now_ms()
    conn = open_rw(path)
    conn.execute("BEGIN")
    insert_rows(conn, "gpus", [dict(gpu_index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3",
                                    first_seen_ms=ts, last_seen_ms=ts) for i in range(8)])
    # An hour of 1 s samples per GPU, so "newest sample" has real history to search.
    insert_rows(conn, "gpu_samples", [dict(gpu_index=i, ts_ms=ts - 1000 * k, gpu_util_pct=k % 100,
                                           mem_used_bytes=k * 1000, mem_free_bytes=80 * GIB, temp_c=60,
                                           power_mw=300_000, energy_mj=k, sm_clock_mhz=1980)
                                      for i in range(8) for k in range(3600)])
    insert_rows(conn, "host_samples", [dict(ts_ms=ts, cpu_pct=10.0, mem_total_bytes=GIB)])
    insert_rows(conn, "runs", [dict(run_id=f"r{r}", name=f"run {r}", uid=1000, user="alice",
                                    status="running" if r % 20 == 0 else "finished",
                                    started_ms=ts - 3_600_000, rank=0) for r in range(1000)])
    insert_rows(conn, "steps", [dict(run_id=f"r{r}", step=s, ts_ms=ts - steps + s, tokens_per_s=1e4,
                                     mem_peak_bytes=s) for r in range(0, 1000, 20) for s in range(steps)])
    conn.execute("COMMIT")
    conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        fill(db, args.steps)
        server = start_metrics_server("127.0.0.1:0", db)
        try:
            timings = []
            size = 0
            for i in range(args.scrapes + 1):
                start = time.perf_counter()
                with urllib.request.urlopen(server.url) as resp:
                    size = len(resp.read())
                if i:  # the first scrape folds in every step's peak once; report it apart
                    timings.append((time.perf_counter() - start) * 1000)
                else:
                    first = (time.perf_counter() - start) * 1000
        finally:
            server.close()
    timings.sort()
    p99 = timings[int(len(timings) * 0.99) - 1]
    print(f"8 GPUs, 50 running runs of 1000, {args.steps} steps per running run, {size} bytes per scrape")
    print(f"first scrape: {first:.1f} ms")
    print(f"{len(timings)} scrapes: p50 {statistics.median(timings):.2f} ms, p99 {p99:.2f} ms, "
          f"max {timings[-1]:.2f} ms (goal p99 <= 50 ms: {'met' if p99 <= 50 else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

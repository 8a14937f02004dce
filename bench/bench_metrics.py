"""Scrape latency of /metrics with 8 GPUs and 50 active runs (goal: p99 <= 50 ms).

Usage: .venv/bin/python bench/bench_metrics.py [--scrapes 500] [--steps 2000]
The database is filled first (1000 runs, 50 running, `--steps` steps each for the running ones,
an hour of GPU samples and of the running runs' process samples), then /metrics is fetched over
HTTP as Prometheus would, with 15 s of new samples stored between scrapes (untimed). Prints
p50/p99/max in milliseconds, and how long a fresh exporter takes to fold in the running runs'
hour of energy (gpuwatch_run_energy_joules_total) in its catch-up thread.
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

GIB = 1024**3
SCRAPE_S = 15  # Prometheus's usual scrape interval: the samples stored between two scrapes
START = 0  # the newest sample's time when filled


def fill(path: Path, steps: int) -> None:
    ts = now_ms()
    conn = open_rw(path)
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "gpus",
        [
            dict(
                gpu_index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", first_seen_ms=ts, last_seen_ms=ts
            )
            for i in range(8)
        ],
    )
    # An hour of 1 s samples per GPU, so "newest sample" has real history to search.
    global START
    START = ts
    insert_rows(
        conn,
        "gpu_samples",
        [
            dict(
                gpu_index=i,
                ts_ms=ts - 1000 * k,
                gpu_util_pct=k % 100,
                mem_used_bytes=k * 1000,
                mem_free_bytes=80 * GIB,
                temp_c=60,
                power_mw=300_000,
                energy_mj=(3600 - k) * 300_000,
                sm_clock_mhz=1980,
            )
            for i in range(8)
            for k in range(3600)
        ],
    )
    # The running runs' processes on the GPUs, a process tick every 5 s, as the sampler writes.
    running = range(0, 1000, 20)
    insert_rows(
        conn,
        "processes",
        [
            dict(
                pid=10_000 + r,
                start_ms=ts - 3_600_000,
                run_id=f"r{r}",
                first_seen_ms=ts - 3_600_000,
                last_seen_ms=ts,
            )
            for r in running
        ],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [
            dict(gpu_index=r // 20 % 8, pid=10_000 + r, ts_ms=ts - 5000 * k, used_mem_bytes=GIB)
            for r in running
            for k in range(720)
        ],
    )
    insert_rows(conn, "host_samples", [dict(ts_ms=ts, cpu_pct=10.0, mem_total_bytes=GIB)])
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id=f"r{r}",
                name=f"run {r}",
                uid=1000,
                user="alice",
                status="running" if r % 20 == 0 else "finished",
                started_ms=ts - 3_600_000,
                rank=0,
            )
            for r in range(1000)
        ],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(run_id=f"r{r}", step=s, ts_ms=ts - steps + s, tokens_per_s=1e4, mem_peak_bytes=s)
            for r in range(0, 1000, 20)
            for s in range(steps)
        ],
    )
    conn.execute("COMMIT")
    conn.close()


def advance(conn, since_ms: int, seconds: int) -> None:
    """What the daemon stores between two scrapes: a second's GPU samples each second, a process
    tick every 5 s (the energy ledger folds these in on the next scrape)."""
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "gpu_samples",
        [
            dict(
                gpu_index=i,
                ts_ms=since_ms + 1000 * k,
                gpu_util_pct=50,
                power_mw=300_000,
                energy_mj=(3600 + (since_ms - START) // 1000 + k) * 300_000,
            )
            for k in range(seconds)
            for i in range(8)
        ],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [
            dict(gpu_index=r // 20 % 8, pid=10_000 + r, ts_ms=since_ms + 1000 * k, used_mem_bytes=GIB)
            for k in range(0, seconds, 5)
            for r in range(0, 1000, 20)
        ],
    )
    conn.execute("COMMIT")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        fill(db, args.steps)
        server = start_metrics_server("127.0.0.1:0", db)
        writer = open_rw(db)
        try:
            timings = []
            size = 0
            catch_up: list[float] = []  # scrapes before the energy series appear
            began = time.perf_counter()
            appeared_s = None
            for i in range(args.scrapes + 1):
                start = time.perf_counter()
                with urllib.request.urlopen(server.url) as resp:
                    body = resp.read()
                    size = len(body)
                took = (time.perf_counter() - start) * 1000
                if len(catch_up) == i and b"gpuwatch_run_energy_joules_total{" not in body:
                    catch_up.append(took)
                elif appeared_s is None:
                    appeared_s = time.perf_counter() - began
                if i:  # the first scrape folds in every step's peak once; report it apart
                    timings.append(took)
                else:
                    first = took
                advance(writer, START + 1000 + SCRAPE_S * 1000 * i, SCRAPE_S)  # not timed
        finally:
            server.close()
            writer.close()
    timings.sort()
    p99 = timings[int(len(timings) * 0.99) - 1]
    print(
        f"8 GPUs, 50 running runs of 1000, {args.steps} steps per running run, {size} bytes per scrape "
        f"({body.count(b'gpuwatch_run_energy_joules_total{')} energy series in the last)"
    )
    print(f"first scrape: {first:.1f} ms")
    print(
        f"energy: the running runs' past hour folded in a thread in {appeared_s or 0:.2f} s "
        f"({len(catch_up)} scrapes without the series meanwhile, max {max(catch_up, default=0):.1f} ms); "
        f"then every scrape folds only what is new"
    )
    print(
        f"{len(timings)} scrapes: p50 {statistics.median(timings):.2f} ms, p99 {p99:.2f} ms, "
        f"max {timings[-1]:.2f} ms (goal p99 <= 50 ms: {'met' if p99 <= 50 else 'MISSED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

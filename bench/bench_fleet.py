"""Fleet figures: series per host on /metrics, and one Fleet refresh at 100 hosts x 8 GPUs.

Usage: .venv/bin/python bench/bench_fleet.py [--hosts 100] [--minutes 10] [--refreshes 20]

1. Series per host: a store with 8 GPUs, 50 GPU processes (each of another user: the worst case
   for the per-user series) and 10 running runs is scraped once; the series are counted by kind
   and set beside dcgm-exporter's default counters on the same 8 GPUs.
2. Refresh: that scrape, relabelled as `--hosts` hosts (one of them down), `--minutes` of samples
   every 15 s, is backfilled into a real Prometheus with `promtool tsdb create-blocks-from
   openmetrics` (synthetic series: labelled so). Then the Fleet screen refreshes `--refreshes`
   times in a headless 80x24 Textual app: Prometheus's time alone (the screen's HTTP queries), the
   fleet read (queries + parsing), and query to painted screen (read + table filled + repaint).
Needs Debian's `prometheus` and `promtool`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.daemon.metrics import start_metrics_server
from gpuwatch.fleet.model import GPU_QUERIES, JOB_QUERIES
from gpuwatch.store import insert_rows, now_ms, open_rw

GIB = 1024**3
GPUS, PROCESSES, RUNS = 8, 50, 10
SCRAPE_S = 15
# dcgm-exporter's etc/default-counters.csv (NVIDIA/dcgm-exporter, main), the fields not commented
# out: one series per GPU each.
DCGM_DEFAULT_FIELDS = (
    "SM_CLOCK",
    "MEM_CLOCK",
    "MEMORY_TEMP",
    "GPU_TEMP",
    "POWER_USAGE",
    "TOTAL_ENERGY_CONSUMPTION",
    "PCIE_TX_THROUGHPUT",
    "PCIE_RX_THROUGHPUT",
    "PCIE_REPLAY_COUNTER",
    "GPU_UTIL",
    "MEM_COPY_UTIL",
    "ENC_UTIL",
    "DEC_UTIL",
    "XID_ERRORS",
    "FB_FREE",
    "FB_USED",
    "NVLINK_BANDWIDTH_TOTAL",
    "VGPU_LICENSE_STATUS",
    "UNCORRECTABLE_REMAPPED_ROWS",
    "CORRECTABLE_REMAPPED_ROWS",
    "ROW_REMAP_FAILURE",
)


def fill(path: Path) -> None:
    ts = now_ms()
    conn = open_rw(path)
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "gpus",
        [
            dict(
                gpu_index=i,
                uuid=f"GPU-{i:04d}",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{i:02X}:00.0",
                mem_total_bytes=80 * GIB,
                first_seen_ms=ts,
                last_seen_ms=ts,
            )
            for i in range(GPUS)
        ],
    )
    insert_rows(
        conn,
        "gpu_samples",
        [
            dict(
                gpu_index=i,
                ts_ms=ts,
                gpu_util_pct=10 * i,
                mem_util_pct=i,
                mem_used_bytes=(i + 1) * GIB,
                mem_free_bytes=(79 - i) * GIB,
                temp_c=60 + i,
                power_mw=300_000,
                energy_mj=10**9,
                sm_clock_mhz=1980,
                mem_clock_mhz=2619,
                pcie_tx_kbps=100,
                pcie_rx_kbps=200,
                fan_pct=40,
                throttle_reasons=0,
                ecc_corrected=0,
                ecc_uncorrected=0,
            )
            for i in range(GPUS)
        ],
    )
    insert_rows(
        conn,
        "host_samples",
        [
            dict(
                ts_ms=ts,
                cpu_pct=10.0,
                load1=1.0,
                mem_total_bytes=512 * GIB,
                mem_used_bytes=GIB,
                mem_available_bytes=500 * GIB,
                swap_used_bytes=0,
                shm_total_bytes=GIB,
                shm_used_bytes=0,
            )
        ],
    )
    insert_rows(
        conn,
        "daemon_stats",
        [
            dict(
                ts_ms=ts, cpu_pct=0.5, rss_bytes=GIB, tick_ms=2.0, queue_depth=0, dropped_events=0, db_bytes=0
            )
        ],
    )
    insert_rows(
        conn,
        "processes",
        [
            dict(
                pid=1000 + p,
                start_ms=ts,
                uid=2000 + p,
                user=f"user{p:02d}",
                first_seen_ms=ts,
                last_seen_ms=ts,
            )
            for p in range(PROCESSES)
        ],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [dict(gpu_index=p % GPUS, pid=1000 + p, ts_ms=ts, used_mem_bytes=GIB) for p in range(PROCESSES)],
    )
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id=f"run-{r}",
                name=f"exp{r}",
                uid=2000 + r,
                user=f"user{r:02d}",
                status="running",
                started_ms=ts - 60_000,
                rank=r % 2,
                job_id=f"job-{r // 2}",
            )
            for r in range(RUNS)
        ],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(run_id=f"run-{r}", step=1, ts_ms=ts, tokens_per_s=1e4, mem_peak_bytes=GIB)
            for r in range(RUNS)
        ],
    )
    conn.execute("COMMIT")
    conn.close()


def one_scrape(tmp: Path) -> str:
    db = tmp / "host.db"
    fill(db)
    server = start_metrics_server("127.0.0.1:0", db, hostname="HOST")
    try:
        with urllib.request.urlopen(server.url) as resp:
            return resp.read().decode()
    finally:
        server.close()


def kind(name: str) -> str:
    if name.startswith("DCGM_FI_DEV_"):
        return "GPU (dcgm-exporter names)"
    if name.startswith("gpuwatch_gpu_user"):
        return "GPU memory per user"
    if name.startswith("gpuwatch_gpu_"):
        return "GPU (gpuwatch's own)"
    if name.startswith("gpuwatch_run"):
        return "runs"
    return "host, daemon, store"


def series_figures(text: str) -> list:
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    by_kind: dict[str, int] = {}
    for s in samples:
        by_kind[kind(s.name)] = by_kind.get(kind(s.name), 0) + 1
    dcgm = len(DCGM_DEFAULT_FIELDS) * GPUS
    print(
        f"series per host: {GPUS} GPUs, {PROCESSES} GPU processes of {PROCESSES} users, {RUNS} running runs"
    )
    for k, n in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {k:<28} {n:>4}")
    print(
        f"  {'total':<28} {len(samples):>4}   dcgm-exporter's default counters: "
        f"{len(DCGM_DEFAULT_FIELDS)} x {GPUS} GPUs = {dcgm}  ({len(samples) / dcgm:.2f}x)"
    )
    return samples


def openmetrics(samples: list, hosts: int, minutes: float, end_s: int) -> str:
    """The scrape as `hosts` hosts, every SCRAPE_S seconds for `minutes`, ending at end_s; host 0
    stops answering early (up 0 from then on, its series end)."""
    points = int(minutes * 60 / SCRAPE_S)
    times = [end_s - SCRAPE_S * (points - 1 - k) for k in range(points)]
    # Backfilled series get no staleness marker: host 0 stops over 5 min (the lookback) before the end.
    stopped = times[0] if minutes <= 6 else end_s - 6 * 60
    by_name: dict[str, list] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    out = []
    for name, group in sorted(by_name.items()):
        out.append(f"# TYPE {name} gauge")
        for h in range(hosts):
            host = f"gpu-{h:03d}"
            last = stopped if h == 0 else end_s
            for s in group:
                labels = dict(s.labels, job="gpuwatch", instance=f"{host}:9400")
                if "Hostname" in labels:
                    labels["Hostname"] = host
                if "job_id" in labels:  # each job runs on two hosts
                    labels["job_id"] = f"{labels['job_id']}-{h // 2}"
                text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                value = s.value if name != "gpuwatch_host_last_sample_timestamp_seconds" else None
                for t in times:
                    if t <= last:
                        out.append(f"{name}{{{text}}} {t if value is None else value} {t}")
    out.append("# TYPE up gauge")
    for h in range(hosts):
        text = f'instance="gpu-{h:03d}:9400",job="gpuwatch"'
        for t in times:
            out.append(f"up{{{text}}} {0 if h == 0 and t > stopped else 1} {t}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"Prometheus at {url} did not become ready")


def pct(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(p * len(values)))]


async def refreshes(url: str, n: int, jobs: bool) -> tuple[list, list, list, object]:
    """n refreshes of the Fleet screen's GPU view (or its Jobs view): per refresh, the time of its
    HTTP queries alone, of the fleet read, and from the read's start to the painted screen."""
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.fleet_source import PrometheusSource
    from gpuwatch.tui.screens.fleet import FleetScreen

    source = PrometheusSource(url, timeout_s=30)
    queries = JOB_QUERIES if jobs else GPU_QUERIES
    raw_pool = ThreadPoolExecutor(max_workers=len(queries))

    def raw(q: str) -> int:
        with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": q})) as r:
            return len(r.read())

    app = GpuwatchApp(source, refresh_s=3600, start_mode="fleet", fleet=source)
    prom_ms, read_ms, paint_ms = [], [], []
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(1.0)
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        if jobs:
            await pilot.press("j")
            await pilot.pause(1.0)
        for i in range(n + 1):
            t0 = time.perf_counter()
            list(raw_pool.map(raw, queries))
            t1 = time.perf_counter()
            snap = source.fetch(screen.view())
            t2 = time.perf_counter()
            screen.update_snapshot(snap)  # fills the table
            # Let the widgets handle their messages, then lay out and paint as Textual's refresh
            # timer would (pilot.pause() would add a wait for the CPU to go idle).
            await pilot._wait_for_screen()
            screen._on_timer_update()
            t3 = time.perf_counter()
            if i:  # the first refresh warms Prometheus's caches and Textual's
                prom_ms.append((t1 - t0) * 1000)
                read_ms.append((t2 - t1) * 1000)
                paint_ms.append((t3 - t1) * 1000)
        shown = screen.shown
    raw_pool.shutdown()
    return prom_ms, read_ms, paint_ms, shown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--refreshes", type=int, default=20)
    args = parser.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        samples = series_figures(one_scrape(tmp))
        if not (prometheus and promtool):
            print("refresh: skipped, needs prometheus and promtool (apt-get install prometheus)")
            return 0
        end_s = int(time.time())
        start = time.perf_counter()
        (tmp / "fleet.om").write_text(openmetrics(samples, args.hosts, args.minutes, end_s))
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "fleet.om"), str(tmp / "tsdb")],
            check=True,
            capture_output=True,
        )
        n_series = len(samples) * args.hosts + args.hosts
        print(
            f"backfilled {n_series} synthetic series ({args.hosts} hosts x {len(samples)} + up), "
            f"{args.minutes:g} min every {SCRAPE_S} s, in {time.perf_counter() - start:.1f} s"
        )
        port = free_port()
        (tmp / "prometheus.yml").write_text("global: {scrape_interval: 1h}\nscrape_configs: []\n")
        with open(tmp / "prometheus.log", "w") as log:
            prom = subprocess.Popen(
                [
                    prometheus,
                    f"--config.file={tmp / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                ],
                stdout=log,
                stderr=log,
            )
            try:
                url = f"http://127.0.0.1:{port}"
                wait_ready(url)
                results = {
                    view: asyncio.run(refreshes(url, args.refreshes, view == "Jobs"))
                    for view in ("GPUs", "Jobs")
                }
            finally:
                prom.terminate()
                prom.wait(timeout=30)
    missed = False
    for view, (prom_ms, read_ms, paint_ms, shown) in results.items():
        fleet = shown.fleet
        if shown.problem or fleet is None:
            print(f"refresh failed: {shown.problem}")
            return 1
        down = [h.name for h in fleet.hosts if not h.up]
        print(
            f"{view} view at 80x24: {len(fleet.hosts)} hosts ({len(down)} down: {', '.join(down)}), "
            f"{len(fleet.gpus)} GPUs, {len(fleet.jobs)} jobs of "
            f"{sum(len(j.ranks) for j in fleet.jobs)} ranks"
        )
        queries = JOB_QUERIES if view == "Jobs" else GPU_QUERIES
        for label, values in (
            (f"Prometheus alone ({len(queries)} queries)", prom_ms),
            ("fleet read (queries+parse)", read_ms),
            ("query to painted screen", paint_ms),
        ):
            print(
                f"  {label:<30} p50 {statistics.median(values):6.0f} ms   p90 {pct(values, 0.9):6.0f} ms   "
                f"max {max(values):6.0f} ms"
            )
        missed |= pct(paint_ms, 0.9) > 300
    print(f"goal: query to painted screen <= 300 ms (p90): {'MISSED' if missed else 'met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

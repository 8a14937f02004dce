"""What the daemon costs: CPU % of one core and RSS at 1 Hz with 8 GPUs and 50 GPU processes.

Spawns 500 real sleeping processes (the host's process table), makes 50 of them the GPU
processes of 8 simulated GPUs (tests/fake_pynvml.py, handed to the daemon as its NVML module),
runs the real daemon main in its own process and measures that process only, after a warm-up.
Also prints the systemd unit's `systemd-analyze security` exposure.

    .venv/bin/python bench/bench_daemon.py [--seconds 60]

Goals: <= 0.5 % of one core, <= 60 MB RSS, exposure <= 2.0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
RUNNER = f"""
import json, sys
sys.path.insert(0, {str(REPO / 'tests')!r})
import fake_pynvml
from gpuwatch.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
pids = json.loads(sys.argv[2])
procs = {{gpu: pids[gpu::8] for gpu in range(8)}}
cfg = load({{"db": sys.argv[1], "socket": sys.argv[3], "interval": 1.0, "host_interval": 1.0,
            "system": False}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8, procs=procs)))
"""


def exposure() -> str:
    if shutil.which("systemd-analyze") is None:
        return "n/a (systemd-analyze not installed)"
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "gpuwatch.service"
        text = (REPO / "systemd" / "gpuwatch.service").read_text()
        unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={REPO / '.venv/bin/gpuwatch'}",
                               text, flags=re.M))
        out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(unit)],
                             capture_output=True, text=True).stdout
    found = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", out)
    return f"{found.group(1)} ({found.group(2)})" if found else "could not parse"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="start-up time not measured")
    args = parser.parse_args()

    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(500)]
    tmp = tempfile.mkdtemp(prefix="gw-bench-")
    try:
        gpu_pids = [p.pid for p in sleepers[:50]]
        db = os.path.join(tmp, "bench.db")
        daemon = subprocess.Popen([sys.executable, "-c", RUNNER, db, json.dumps(gpu_pids),
                                   os.path.join(tmp, "s.sock")],
                                  stderr=subprocess.PIPE, text=True)
        proc = psutil.Process(daemon.pid)
        time.sleep(args.warmup)
        cpu0, wall0 = sum(proc.cpu_times()[:4]), time.monotonic()
        rss_peak = 0
        while time.monotonic() - wall0 < args.seconds:
            time.sleep(1.0)
            rss_peak = max(rss_peak, proc.memory_info().rss)
        cpu1, wall1 = sum(proc.cpu_times()[:4]), time.monotonic()
        rss_end = proc.memory_info().rss
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=30)
        conn = sqlite3.connect(db)
        ticks = conn.execute("SELECT count(DISTINCT ts_ms) FROM gpu_samples").fetchone()[0]
        procs = conn.execute("SELECT count(*) FROM processes").fetchone()[0]
        self_cpu = conn.execute("SELECT avg(cpu_pct), avg(tick_ms), max(tick_ms) FROM daemon_stats "
                                "WHERE ts_ms > (SELECT min(ts_ms) + ? FROM daemon_stats)",
                                (int(args.warmup * 1000),)).fetchone()
        conn.close()
        db_bytes = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    window = wall1 - wall0
    print(f"daemon at 1 Hz, 8 GPUs (simulated), 50 GPU processes among 500 host processes, "
          f"{window:.0f} s measured after {args.warmup:.0f} s warm-up")
    print(f"  CPU: {100 * (cpu1 - cpu0) / window:.2f} % of one core (goal <= 0.5 %; "
          f"process + children CPU time / wall time)")
    print(f"  CPU as the daemon reports itself (daemon_stats avg): {self_cpu[0]:.2f} %")
    print(f"  GPU tick: avg {self_cpu[1]:.1f} ms, max {self_cpu[2]:.1f} ms")
    print(f"  RSS: {rss_end / 2**20:.1f} MB at the end, {rss_peak / 2**20:.1f} MB peak (goal <= 60 MB)")
    print(f"  ticks written: {ticks}; processes rows: {procs}; database {db_bytes / 2**20:.1f} MB")
    print(f"  exit status after SIGTERM: {daemon.returncode}")
    print(f"systemd-analyze security --offline=true exposure: {exposure()} (goal <= 2.0)")
    if daemon.returncode != 0:
        print(err, file=sys.stderr)


if __name__ == "__main__":
    main()

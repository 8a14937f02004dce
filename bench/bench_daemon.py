"""What the daemon costs beside nvitop: CPU % of one core and RSS at 1 Hz with 8 GPUs and 50 GPU
processes among 500 host processes, top-process sampling included.

Spawns 500 real sleeping processes (the host's process table), makes 50 of them the GPU
processes of 8 simulated GPUs (tests/fake_pynvml.py, handed to the daemon as its NVML module),
runs the real daemon main in its own process and, in the same window, nvitop refreshing the same
simulated node once a second (`Device.as_snapshot()` for every GPU, their processes, and
`GpuProcess.take_snapshots` of them: what its screen shows), through bench/nvitop_shim; each
process's own CPU time is measured over the same window after a warm-up. nvitop is a checkout
or install of XuehaiPan/nvitop, never part of this repository (--nvitop: the directory holding
its `nvitop` package; default: an importable nvitop). Also prints the systemd unit's
`systemd-analyze security` exposure. As root it runs in a pid namespace of its own (unshare),
so that the node has the 500 processes it says and not the rest of the machine's (the daemon
reads every process of the host for its top CPU consumers); --whole-host to run beside them.

    .venv/bin/python bench/bench_daemon.py [--seconds 60] [--nvitop /tmp/nvitop-src] [--whole-host]

Goals: daemon <= 0.3 x nvitop's CPU in the same run, <= 60 MB RSS, exposure <= 2.0.
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
sys.path.insert(0, {str(REPO / "tests")!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
pids = json.loads(sys.argv[2])
procs = {{gpu: pids[gpu::8] for gpu in range(8)}}
cfg = load({{"db": sys.argv[1], "socket": sys.argv[3], "interval": 1.0, "host_interval": 1.0,
            "system": False}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8, procs=procs)))
"""


NVITOP = """
import sys, time
from nvitop import Device, GpuProcess
devices = Device.all()
due = time.monotonic()
while True:  # one refresh a second, as `nvitop --interval 1`
    snapshots = [device.as_snapshot() for device in devices]
    processes = [p for device in devices for p in device.processes().values()]
    GpuProcess.take_snapshots(processes, failsafe=True)
    due += 1.0
    time.sleep(max(0.0, due - time.monotonic()))
"""


def start_nvitop(path: str | None, gpu_pids: list[int]) -> subprocess.Popen | None:
    """nvitop refreshing the simulated node (bench/nvitop_shim), or None if it cannot import."""
    paths = [str(REPO / "bench" / "nvitop_shim")] + ([path] if path else [])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "GPUWATCH_TESTS": str(REPO / "tests"),
        "NVITOP_FAKE_PIDS": ",".join(map(str, gpu_pids)),
    }
    if subprocess.run([sys.executable, "-c", "import nvitop"], env=env, capture_output=True).returncode:
        return None
    return subprocess.Popen([sys.executable, "-c", NVITOP], env=env, stderr=subprocess.PIPE, text=True)


def cpu_s(proc: psutil.Process) -> float:
    return sum(proc.cpu_times()[:4])


def exposure() -> str:
    if shutil.which("systemd-analyze") is None:
        return "n/a (systemd-analyze not installed)"
    with tempfile.TemporaryDirectory() as tmp:
        unit = Path(tmp) / "gpuwatch.service"
        text = (REPO / "systemd" / "gpuwatch.service").read_text()
        unit.write_text(
            re.sub(r"^ExecStart=\S+", f"ExecStart={REPO / '.venv/bin/gpuwatch'}", text, flags=re.M)
        )
        out = subprocess.run(
            ["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True
        ).stdout
    found = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", out)
    return f"{found.group(1)} ({found.group(2)})" if found else "could not parse"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="start-up time not measured")
    parser.add_argument(
        "--nvitop",
        metavar="DIR",
        help="directory holding nvitop's package (a checkout "
        "of github.com/XuehaiPan/nvitop); default: nvitop if importable",
    )
    parser.add_argument(
        "--whole-host",
        action="store_true",
        help="do not run in a pid namespace of "
        "its own: the daemon then walks every process of this machine too",
    )
    args = parser.parse_args()
    if (
        not args.whole_host
        and os.environ.get("GW_BENCH_PID_NS") != "1"
        and os.geteuid() == 0
        and shutil.which("unshare")
    ):
        os.execvpe(
            "unshare",
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, __file__, *sys.argv[1:]],
            {**os.environ, "GW_BENCH_PID_NS": "1"},
        )

    sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(500)]
    tmp = tempfile.mkdtemp(prefix="gw-bench-")
    try:
        gpu_pids = [p.pid for p in sleepers[:50]]
        db = os.path.join(tmp, "bench.db")
        daemon = subprocess.Popen(
            [sys.executable, "-c", RUNNER, db, json.dumps(gpu_pids), os.path.join(tmp, "s.sock")],
            stderr=subprocess.PIPE,
            text=True,
        )
        nvitop = start_nvitop(args.nvitop, gpu_pids)
        proc = psutil.Process(daemon.pid)
        time.sleep(args.warmup)
        host_procs = sum(name.isdigit() for name in os.listdir("/proc"))  # all the walk reads
        where = "in a pid namespace of its own" if os.environ.get("GW_BENCH_PID_NS") == "1" else "whole host"
        print(
            f"load average at the start: {os.getloadavg()[0]:.2f}; {host_procs} processes on the "
            f"node ({where})",
            flush=True,
        )
        nv_proc = psutil.Process(nvitop.pid) if nvitop else None
        split0 = proc.cpu_times()
        cpu0, nv0, wall0 = cpu_s(proc), cpu_s(nv_proc) if nv_proc else 0.0, time.monotonic()
        rss_peak = 0
        while time.monotonic() - wall0 < args.seconds:
            time.sleep(1.0)
            rss_peak = max(rss_peak, proc.memory_info().rss)
        cpu1, nv1, wall1 = cpu_s(proc), cpu_s(nv_proc) if nv_proc else 0.0, time.monotonic()
        split1 = proc.cpu_times()
        load_end = os.getloadavg()[0]
        rss_end = proc.memory_info().rss
        if nvitop:
            nvitop.kill()
            nv_err = nvitop.communicate(timeout=30)[1]
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=30)
        conn = sqlite3.connect(db)
        ticks = conn.execute("SELECT count(DISTINCT ts_ms) FROM gpu_samples").fetchone()[0]
        procs = conn.execute("SELECT count(*) FROM processes").fetchone()[0]
        top = conn.execute("SELECT count(DISTINCT ts_ms), count(*) FROM host_top_processes").fetchone()
        self_cpu = conn.execute(
            "SELECT avg(cpu_pct), avg(tick_ms), max(tick_ms) FROM daemon_stats "
            "WHERE ts_ms > (SELECT min(ts_ms) + ? FROM daemon_stats)",
            (int(args.warmup * 1000),),
        ).fetchone()
        conn.close()
        db_bytes = sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    window = wall1 - wall0
    ours = 100 * (cpu1 - cpu0) / window
    print(
        f"daemon at 1 Hz, 8 GPUs (simulated), 50 GPU processes among 500 host processes, "
        f"{window:.0f} s measured after {args.warmup:.0f} s warm-up; load average at the end {load_end:.2f}"
    )
    print(f"  {'':<34}{'CPU % of one core':>18}{'ms per second':>15}")
    print(
        f"  {'gpuwatch daemon (top processes on)':<34}{ours:>18.2f}{10 * ours:>15.2f}   "
        f"(user {1000 * (split1.user - split0.user) / window:.2f}, "
        f"system {1000 * (split1.system - split0.system) / window:.2f} ms per second)"
    )
    if nvitop:
        theirs = 100 * (nv1 - nv0) / window
        print(f"  {'nvitop, one refresh a second':<34}{theirs:>18.2f}{10 * theirs:>15.2f}")
        print(f"  daemon / nvitop: {ours / theirs:.2f}x (goal <= 0.3x)")
        if nvitop.returncode not in (0, -signal.SIGKILL):
            print(nv_err, file=sys.stderr)
    else:
        print("  nvitop: not importable (fetch github.com/XuehaiPan/nvitop and pass --nvitop DIR)")
    print(f"  CPU as the daemon reports itself (daemon_stats avg): {self_cpu[0]:.2f} %")
    print(f"  GPU tick: avg {self_cpu[1]:.1f} ms, max {self_cpu[2]:.1f} ms")
    print(f"  RSS: {rss_end / 2**20:.1f} MB at the end, {rss_peak / 2**20:.1f} MB peak (goal <= 60 MB)")
    print(
        f"  ticks written: {ticks}; processes rows: {procs}; top-process ticks: {top[0]} "
        f"({top[1]} rows); database {db_bytes / 2**20:.1f} MB"
    )
    print(f"  exit status after SIGTERM: {daemon.returncode}")
    print(f"systemd-analyze security --offline=true exposure: {exposure()} (goal <= 2.0)")
    if daemon.returncode != 0:
        print(err, file=sys.stderr)


if __name__ == "__main__":
    main()

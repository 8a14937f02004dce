"""Cost of one collector tick: NVML on 8 simulated GPUs, the host, GPU-process usage, the host walk.

Usage: .venv/bin/python bench/bench_collectors.py [--ticks 500] [--procs-per-gpu 4]
NVML runs against tests/fake_pynvml.py (simulated GPUs), so its figure is gpuwatch's own Python
overhead per tick, not the driver's; on real GPUs add the driver's time (nvmlDeviceGetPcieThroughput
alone samples for about 20 ms per counter). The host and process figures are real (psutil).
Prints p50/p99 in milliseconds and the CPU seconds per 1000 ticks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fake_pynvml  # noqa: E402

from collectors.host import HostCollector  # noqa: E402
from collectors.nvml import NvmlCollector  # noqa: E402
from collectors.processes import ProcessCollector  # noqa: E402


def measure(label: str, ticks: int, tick) -> None:
    times = []
    cpu0 = time.process_time()
    for i in range(ticks):
        t0 = time.perf_counter()
        tick(i)
        times.append((time.perf_counter() - t0) * 1000)
    cpu = time.process_time() - cpu0
    times.sort()
    print(
        f"{label:<44} p50 {statistics.median(times):7.3f} ms   "
        f"p99 {times[int(len(times) * 0.99) - 1]:7.3f} ms   "
        f"cpu {cpu / ticks * 1000:6.3f} s per 1000 ticks"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=500)
    ap.add_argument("--procs-per-gpu", type=int, default=4)
    args = ap.parse_args()

    nvml = NvmlCollector(fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=args.procs_per_gpu))
    # sample_tick: what the sampler calls, every GPU's reads and the XID events in one round.
    measure(f"NVML, 8 GPUs x {args.procs_per_gpu} procs (simulated)", args.ticks, nvml.sample_tick)
    nvml.close()
    # The same with GPM on every GPU, as on Hopper: one nvmlGpmSampleGet and one
    # nvmlGpmMetricsGet more per GPU and tick (the fake's cost of them, not a driver's).
    nvml = NvmlCollector(fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=args.procs_per_gpu, gpm=range(8)))
    measure(f"NVML + GPM, 8 GPUs x {args.procs_per_gpu} procs (simulated)", args.ticks, nvml.sample_tick)
    nvml.close()

    host = HostCollector()
    measure("host (psutil)", args.ticks, lambda i: host.sample(i))

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(8)]
    try:
        procs = ProcessCollector()
        pids = [c.pid for c in children] + [os.getpid()]
        measure("process usage, 9 real pids", args.ticks, lambda i: procs.usage(pids))
        measure("process info, 9 real pids (cached)", args.ticks, lambda i: [procs.info(p) for p in pids])
        count = sum(name.isdigit() for name in os.listdir("/proc"))
        measure(f"walk of all {count} processes (top CPU)", max(20, args.ticks // 10), lambda i: procs.walk())
    finally:
        for c in children:
            c.kill()
            c.wait()


if __name__ == "__main__":
    main()

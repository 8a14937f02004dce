"""GPM (Hopper and later) against a known load: a child process keeps one GPU busy with bf16
matrix multiplies, which keep nearly every SM and the tensor cores busy; the collector's own GPM
figures over that window must say so, and say less while the GPU idles before it. The verdict is
a pure function below, tested without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gpuwatch.selftest.result import FAIL, OK, SKIPPED, Result

CHECK = "GPM SM activity under a known load"
BUSY_SM_ACTIVE_MIN = 70.0  # % of SMs busy during back-to-back 8192² bf16 matmuls
WINDOW_S = 2.0  # each GPM interval measured
LOAD_S = 8.0  # how long the child keeps the GPU busy (covers warm-up and the window)

_LOAD = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = a @ a
torch.cuda.synchronize()
print("busy", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
"""


def gpm_verdict(gpu: str, idle, busy) -> list[Result]:
    """`idle`/`busy`: the collector's GpuProfSample of that GPU before and during the load."""
    if busy is None or busy.sm_active_pct is None:
        return [Result(CHECK, FAIL, f"{gpu}: GPM gave no SM activity during the load")]
    ok = busy.sm_active_pct >= BUSY_SM_ACTIVE_MIN
    results = [
        Result(
            CHECK,
            OK if ok else FAIL,
            f"{gpu}: SM active {busy.sm_active_pct:.0f} % under bf16 matmuls "
            f"(idle before: {_pct(idle and idle.sm_active_pct)})",
            f">= {BUSY_SM_ACTIVE_MIN:.0f} %",
        )
    ]
    tensor = busy.tensor_active_pct
    results.append(
        Result(
            "GPM tensor-core activity under bf16 matmuls",
            OK if tensor else FAIL,
            f"{gpu}: tensor active {_pct(tensor)}, DRAM active {_pct(busy.dram_active_pct)}, "
            f"SM occupancy {_pct(busy.sm_occupancy_pct)}",
            "> 0 %",
        )
    )
    if idle is not None and idle.sm_active_pct is not None and idle.sm_active_pct >= busy.sm_active_pct:
        results.append(
            Result(
                "GPM SM activity: busy above idle",
                FAIL,
                f"{gpu}: idle {idle.sm_active_pct:.0f} % >= busy {busy.sm_active_pct:.0f} %",
            )
        )
    return results


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.0f} %"


def check() -> list[Result]:
    """Needs a GPU with GPM and torch with CUDA; skipped (with why) elsewhere."""
    from collectors.nvml import NvmlCollector, NvmlUnavailable

    try:
        collector = NvmlCollector()
    except NvmlUnavailable as e:
        return [Result(CHECK, SKIPPED, str(e))]
    try:
        return _measure(collector)
    finally:
        collector.close()


def _gpm_of(collector, index: int):
    collector.sample(int(time.time() * 1000))
    return next((s for s in collector.sample_gpm(int(time.time() * 1000)) if s.gpu_index == index), None)


def _measure(collector) -> list[Result]:
    collector.sample(0)
    collector.sample_gpm(0)  # primes every GPU that has GPM
    time.sleep(WINDOW_S)
    idle = {s.gpu_index: s for s in collector.sample_gpm(int(time.time() * 1000))}
    if not idle:
        names = ", ".join(f"GPU {s.gpu_index} {s.name}" for s in collector.static) or "no GPU"
        return [Result(CHECK, SKIPPED, f"no GPU here has GPM (Hopper and later, driver 520+): {names}")]
    index = min(idle)
    static = collector.static[index]
    gpu = f"GPU {index} {static.name}"
    load = subprocess.Popen(
        [sys.executable, "-c", _LOAD, str(LOAD_S)],
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=static.uuid),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if load.stdout.readline().strip() != "busy":
            why = (load.stderr.read() or "").strip().splitlines()
            return [
                Result(
                    CHECK,
                    SKIPPED,
                    f"the load could not start on {gpu}: {why[-1] if why else 'no CUDA through torch'}",
                )
            ]
        _gpm_of(collector, index)  # the window starts with the load running
        time.sleep(WINDOW_S)
        busy = _gpm_of(collector, index)
    finally:
        load.kill()
        load.wait()
    return gpm_verdict(gpu, idle[index], busy)

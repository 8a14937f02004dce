"""Step-time cost of the profiling hook while it is attached but idle (CPU, embedded mode).

One process, a tiny torch model, blocks of steps interleaved so drift hits every variant alike:
  plain      the training step alone (no gpuwatch)
  idle hook  the step + run.step() of a run whose profiling hook never fired
  after      the step + run.step() of a run that profiled a window on demand, now idle again
Prints the median step time of each (median of block medians), the differences, and the noise
band (half the spread between the quartiles of a variant's block medians). Goal: "after" -
"idle hook" is 0 within noise; the hook's own check costs tens of nanoseconds.

    .venv/bin/python bench/bench_profiler.py [--blocks 30] [--steps 100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import timeit


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=30, help="blocks per variant (interleaved)")
    p.add_argument("--steps", type=int, default=100, help="steps per block")
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="gw-bench-prof-")
    os.environ.update(
        XDG_DATA_HOME=tmp,
        XDG_RUNTIME_DIR=tmp,
        GPUWATCH_SOCKET=f"{tmp}/none.sock",
        GPUWATCH_RUNS_DIR=f"{tmp}/runs",
    )
    import time

    import torch

    import gpuwatch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    x = torch.randn(8, 64)

    def train_step() -> None:
        model(x).sum().backward()

    idle = gpuwatch.track(name="bench-idle-hook")
    after = gpuwatch.track(name="bench-after-window")
    after._profiling.request(3)  # what the daemon's control message does
    while after._profiling.active:  # 1 warm-up + 3 profiled steps, then saved and idle again
        train_step()
        after.step(tokens=8)

    variants = {"plain": None, "idle hook": idle, "after": after}
    blocks: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.blocks):
        for name, run in variants.items():
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter_ns()
                train_step()
                if run is not None:
                    run.step(tokens=8)
                times.append(time.perf_counter_ns() - t0)
            blocks[name].append(statistics.median(times) / 1000.0)
    idle.finish()
    after.finish()

    def median_and_noise(name: str) -> tuple[float, float]:
        q1, _, q3 = statistics.quantiles(blocks[name], n=4)
        return statistics.median(blocks[name]), (q3 - q1) / 2

    print(
        f"{args.blocks} blocks x {args.steps} steps per variant, interleaved; torch {torch.__version__}, CPU"
    )
    for name in variants:
        med, noise = median_and_noise(name)
        print(f"  {name:<10} median step {med:8.1f} us   noise band +/- {noise:.1f} us")
    (idle_med, idle_noise), (after_med, after_noise) = (
        median_and_noise("idle hook"),
        median_and_noise("after"),
    )
    band = max(idle_noise, after_noise)
    verdict = "within noise" if abs(after_med - idle_med) <= band else "OUTSIDE noise"
    print(f"  after - idle hook: {after_med - idle_med:+.1f} us ({verdict}, band +/- {band:.1f} us)")
    print(
        f"  idle hook - plain: {idle_med - median_and_noise('plain')[0]:+.1f} us (run.step() itself; "
        f"see bench_step.py)"
    )
    check = after._profiling
    n = 1_000_000
    ns = timeit.timeit("check.active and None", globals={"check": check}, number=n) / n * 1e9
    print(f"  the hook's check alone: {ns:.0f} ns per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())

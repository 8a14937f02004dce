"""Cost of run.step() on the training loop's thread (CPU, embedded mode: the real transport).

Prints the median, p99 and mean µs per call, with memory figures (RSS) and a loss tensor, and
the median as a share of a 10 ms step. Goals: median <= 20 µs, <= 1 % of a 10 ms step.
A third loop adds run.mark_compute() before each step (the data wait's cost).
Two loops: back to back (the writer thread fights the loop for the GIL, the worst case), and
paced by 1 ms of GIL-free "work" per step (what a real training step leaves the writer).

    .venv/bin/python bench/bench_step.py [--calls 20000] [--paced-calls 2000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time


def measure(run, loss, calls: int, work_s: float, mark_compute: bool = False) -> list[int]:
    costs_ns = []
    for _ in range(calls):
        if work_s:
            time.sleep(work_s)  # releases the GIL, as torch kernels do
        t0 = time.perf_counter_ns()
        if mark_compute:  # what the zero-code hooks add: the data wait's end, then the step
            run.mark_compute()
        run.step(tokens=4096, samples=1, seq_len=4096, loss=loss)
        costs_ns.append(time.perf_counter_ns() - t0)
    return costs_ns


def reference(calls: int, work_s: float) -> float:
    """Median µs of a fixed pure-Python job (60 dict inserts), to show what pacing alone costs
    on this machine (caches and CPU clocks go cold during the sleep)."""
    costs_ns = []
    for _ in range(calls):
        if work_s:
            time.sleep(work_s)
        t0 = time.perf_counter_ns()
        d = {}
        for i in range(60):
            d[i] = i
        costs_ns.append(time.perf_counter_ns() - t0)
    return statistics.median(costs_ns) / 1000


def report(label: str, costs_ns: list[int]) -> None:
    median_us = statistics.median(costs_ns) / 1000
    p99_us = statistics.quantiles(costs_ns, n=100)[98] / 1000
    print(
        f"  {label}: {len(costs_ns)} calls: median {median_us:.1f} µs   p99 {p99_us:.1f} µs   "
        f"mean {statistics.fmean(costs_ns) / 1000:.1f} µs   median = {median_us / 100:.2f} % of a "
        f"10 ms step ({'met' if median_us <= 20 else 'MISSED'}: <= 20 µs, <= 1 %)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--paced-calls", type=int, default=2_000)
    args = parser.parse_args()

    # A private database and no daemon: the embedded transport, as on a laptop.
    tmp = tempfile.mkdtemp(prefix="gw-bench-step-")
    os.environ.update(XDG_DATA_HOME=tmp, XDG_RUNTIME_DIR=tmp, GPUWATCH_CONFIG=os.path.join(tmp, "none.toml"))
    import torch

    import gpuwatch

    loss = torch.tensor(2.5)
    with gpuwatch.track(name="bench-step") as run:
        print(
            f"run.step() on CPU, {run._transport.mode} transport, RSS + loss tensor "
            f"(python {sys.version.split()[0]}, torch {torch.__version__})"
        )
        measure(run, loss, 200, 0.0)  # warm up
        back_to_back = measure(run, loss, args.calls, 0.0)
        run._transport.flush(60)
        with_wait = measure(run, loss, args.calls, 0.0, mark_compute=True)
        run._transport.flush(60)
        paced = measure(run, loss, args.paced_calls, 0.001)
        t_end = time.perf_counter()
    flush_s = time.perf_counter() - t_end
    report("back to back", back_to_back)
    report("paced, 1 ms ", paced)
    report("back to back, mark_compute() + step() (data wait)", with_wait)
    print(f"  end of run (drain, run_end, flush): {flush_s:.2f} s")
    print(
        f"  reference job (not gpuwatch): back to back {reference(5000, 0.0):.1f} µs, "
        f"paced {reference(1000, 0.001):.1f} µs"
    )
    from gpuwatch.client import helpers

    helpers.stop_recorder()  # it holds the database in `tmp`
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

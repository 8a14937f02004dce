"""Does a training step slow down while a profile window's trace is analysed?

One process trains a small CPU model (one torch thread) and times every step in three kinds of
phase, alternated in rounds:

  no analysis          nothing else running
  in-process thread    the trace analysed on a thread of the training process (how profile
                       windows were analysed before: it holds the GIL the training loop needs)
  trace worker         the trace analysed the way profiling.Profiling does now: a
                       `python -m gpuwatch.client.trace_worker` process at nice +10, waited for
                       by a thread that holds no GIL while it waits

A phase with an analysis lasts until the analysis ends; a phase without one takes as many steps
as the last one did. Goal: a step during the trace worker's analysis costs no more than one
without (median within 5 %).

    .venv/bin/python bench/bench_analysis_offload.py [--mb 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trace import write_big_trace  # noqa: E402 — a trace of the size asked for

GOAL = 1.05


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import torch

    from gpuwatch.client.profiling import _Analysis
    from gpuwatch.client.trace_worker import breakdown_of

    torch.set_num_threads(1)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> float:
        started = time.perf_counter()
        loss = model(torch.randn(64, 256)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return (time.perf_counter() - started) * 1000

    def steps_while(done: threading.Event) -> list[float]:
        times = []
        while not done.is_set():
            times.append(step())
        return times

    def in_thread(path: Path) -> threading.Event:
        done = threading.Event()
        threading.Thread(target=lambda: (breakdown_of(path), done.set()), daemon=True).start()
        return done

    def in_worker(path: Path) -> threading.Event:
        done = threading.Event()
        _Analysis(path, {}, lambda kind, **fields: done.set())
        return done

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "window.json"
        size = write_big_trace(trace, args.mb)
        print(
            f"trace: {size / 1e6:.0f} MB; steps of {sum(p.numel() for p in model.parameters()):,} "
            f"parameters on one CPU thread",
            file=sys.stderr,
        )
        for _ in range(20):  # warm-up
            step()
        phases: dict[str, list[float]] = {"no analysis": [], "in-process thread": [], "trace worker": []}
        seconds: dict[str, list[float]] = {"in-process thread": [], "trace worker": []}
        last = 200
        for n in range(args.rounds):
            for name, start in (("in-process thread", in_thread), ("trace worker", in_worker)):
                phases["no analysis"] += [step() for _ in range(last)]
                began = time.perf_counter()
                times = steps_while(start(trace))
                seconds[name].append(time.perf_counter() - began)
                phases[name] += times
                last = len(times)
                print(
                    f"round {n + 1}/{args.rounds}: {name}: {len(times)} steps in "
                    f"{seconds[name][-1]:.1f} s (load {os.getloadavg()[0]:.1f})",
                    file=sys.stderr,
                    flush=True,
                )
    base = statistics.median(phases["no analysis"])
    print(
        f"{'phase':<20} {'steps':>6} {'median ms':>10} {'p90 ms':>8} {'vs none':>8} {'analysis s':>11}"
        f"   (load average {os.getloadavg()[0]:.1f})"
    )
    for name, times in phases.items():
        median = statistics.median(times)
        p90 = statistics.quantiles(times, n=10)[-1]
        spent = f"{statistics.median(seconds[name]):.1f}" if name in seconds else "-"
        print(f"{name:<20} {len(times):>6} {median:>10.2f} {p90:>8.2f} {median / base:>7.2f}x {spent:>11}")
    ratio = statistics.median(phases["trace worker"]) / base
    print(
        f"a step while a {args.mb:.0f} MB window is analysed by the trace worker: {ratio:.2f}x one without "
        f"({'met' if ratio <= GOAL else 'MISSED'}: goal <= {GOAL:.2f}x)"
    )


if __name__ == "__main__":
    main()

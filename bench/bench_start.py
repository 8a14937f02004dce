"""What `gpuwatch run` adds to a short training script's wall time, with no daemon running.

The script imports torch and takes three optimiser steps. Three ways of running it, alternated
in rounds so that the host's load falls on each alike:

  plain              python script.py
  not instrumented   gpuwatch run --no-instrument -- python script.py   (the wrapper alone)
  gpuwatch run       gpuwatch run -- python script.py                   (wrapper + hooks)

Goal: gpuwatch run's median within 0.3 s of plain's. Byte-compiled files are written and used
(as in any installed package), whatever PYTHONDONTWRITEBYTECODE says here. Beside each wall time
the CPU time (user + system) of the whole process tree: a steadier figure on a loaded host.
With --before DIR (a checkout of an earlier commit, e.g. `git archive REV | tar -x -C DIR`),
that version's `gpuwatch run` is timed in the same rounds. "paired" is the median of each
round's own difference from plain: a host whose load drifts between rounds moves both alike.

    .venv/bin/python bench/bench_start.py [--rounds 7] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 0.3
SCRIPT = """\
import torch
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(3):
    loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print("loss", loss.item())
"""


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s of the process and every descendant it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", type=Path, help="an earlier checkout to time beside this one")
    args = parser.parse_args()
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "three_steps.py"
        script.write_text(SCRIPT)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        # A fresh per-user database and no daemon: the embedded path a first user meets.
        env.update(
            XDG_DATA_HOME=str(Path(tmp) / "data"),
            XDG_RUNTIME_DIR=str(Path(tmp) / "run"),
            GPUWATCH_SOCKET=str(Path(tmp) / "no-daemon.sock"),
        )
        Path(env["XDG_RUNTIME_DIR"]).mkdir(mode=0o700)
        run = [gpuwatch, "run", "--", sys.executable, str(script)]
        ways = {
            "plain": ([sys.executable, str(script)], env),
            "not instrumented": (
                [gpuwatch, "run", "--no-instrument", "--", sys.executable, str(script)],
                env,
            ),
            "gpuwatch run": (run, env),
        }
        if args.before:
            ways["gpuwatch run, before"] = (run, dict(env, PYTHONPATH=str(args.before.resolve())))
        for cmd, way_env in ways.values():  # warm the page cache, write .pyc files, create the database
            timed(cmd, way_env)
        times: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        loads = []
        for n in range(args.rounds):
            for way, (cmd, way_env) in ways.items():
                times[way].append(timed(cmd, way_env))
            loads.append(os.getloadavg()[0])
            print(
                f"round {n + 1}/{args.rounds}: "
                + ", ".join(f"{w} {t[-1][0]:.2f} s" for w, t in times.items())
                + f" (load {loads[-1]:.1f})",
                file=sys.stderr,
                flush=True,
            )
    wall = {way: statistics.median(t[0] for t in ts) for way, ts in times.items()}
    cpu = {way: statistics.median(t[1] for t in ts) for way, ts in times.items()}
    print(f"median of {args.rounds} alternated rounds; load average {min(loads):.1f}-{max(loads):.1f}")
    print(
        f"{'way':<22} {'wall s':>7} {'over plain':>11} {'paired':>7} "
        f"{'CPU s':>7} {'over plain':>11} {'paired':>7}"
    )
    for way in ways:
        paired = [statistics.median(t[k] - p[k] for t, p in zip(times[way], times["plain"])) for k in (0, 1)]
        print(
            f"{way:<22} {wall[way]:>7.2f} {wall[way] - wall['plain']:>+11.2f} {paired[0]:>+7.2f} "
            f"{cpu[way]:>7.2f} {cpu[way] - cpu['plain']:>+11.2f} {paired[1]:>+7.2f}"
        )
    over = wall["gpuwatch run"] - wall["plain"]
    plain_walls = [t[0] for t in times["plain"]]
    spread = statistics.median(abs(w - wall["plain"]) for w in plain_walls)  # plain's own noise
    verdict = (
        (
            "INCONCLUSIVE: plain's own runs spread more than the goal (median deviation "
            f"{spread:.2f} s); run it on a quieter host"
        )
        if spread > GOAL_S / 2
        else ("met" if over <= GOAL_S else "MISSED")
    )
    print(
        f"gpuwatch run adds {over:+.2f} s to the three-step script (median of {args.rounds}, alternated): "
        f"{verdict} (goal <= +{GOAL_S} s)"
    )


if __name__ == "__main__":
    main()

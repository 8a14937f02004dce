"""A GPU whose NVML calls hang: what it costs the other GPUs and the host; and how soon
`gpuwatch tui` shows live GPUs on a fresh install with no daemon.

Runs the real daemon in its own process on 8 simulated GPUs (tests/fake_pynvml.py); every NVML
call on GPU 3 blocks from --hang-at seconds on (the "nvidia-smi hangs" of a GPU in a bad state).

    .venv/bin/python bench/bench_faults.py [--seconds 30] [--interval 1.0] [--hang-at 5] [--busy]

Prints, over the ticks after the hang began: the healthy GPUs' tick lateness p50/p99 (each
sample's time against the tick's place on the cadence; goal p99 <= 100 ms), the samples lost
on healthy GPUs (ticks of the host with no sample of that GPU; goal 0), and the time from the
hang until GPU 3 is shown as not responding (goal <= 3 intervals), and the "not responding"
lines about any other GPU (goal 0). --busy adds a thread to the daemon that holds the GIL most
of the time (json.loads of a 150,000-event document, ~0.1-0.4 s each, again and again with a
20 ms pause between: a spool replay's work in chunks), as a daemon flooded with work would. Then, unless --no-tui:
`gpuwatch tui` started in an 80x24 tmux with no daemon and no database (8 simulated GPUs through
tests/fake_driver), the seconds until its screen shows every GPU (goal <= 2 s), three times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from collectors.deadline import QUIET_MAX_S  # noqa: E402
from gpuwatch.monitor.sampler import NVML_DEADLINE_SHARE  # noqa: E402

HUNG = 3
RUNNER = f"""
import json, sys, threading, time
sys.path.insert(0, {str(REPO / "tests")!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
interval, hang_at = float(sys.argv[3]), float(sys.argv[4])
if sys.argv[5] == "busy":  # a replay's parsing: the GIL held ~0.1-0.4 s at a time, again and again
    doc = json.dumps([{{"step": i, "loss": 1.0 / (i + 1), "tokens": 256}} for i in range(150_000)])
    threading.Thread(target=lambda: [(json.loads(doc), time.sleep(0.02)) for _ in iter(int, 1)],
                     daemon=True).start()
nvml = fake_pynvml.FakeNvml(gpus=8, hang={{{HUNG}: hang_at}})
print(time.time() + hang_at, flush=True)  # when the hang begins, wall clock
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "interval": interval, "host_interval": interval,
            "system": False}})
sys.exit(run_daemon(cfg, nvml_module=nvml))
"""


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values) or [float("nan")]
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def tui_first_gpus_s(tmp: str) -> float:
    """Seconds from starting `gpuwatch tui` (no daemon, no database) to all 8 GPUs on screen."""
    tmux = ["tmux", "-L", f"bench-faults-{os.getpid()}"]
    env = (
        f"PYTHONPATH={REPO / 'tests' / 'fake_driver'}:{REPO} XDG_DATA_HOME={tmp}/data "
        f"XDG_RUNTIME_DIR={tmp}/run GPUWATCH_CONFIG={tmp}/none.toml"
    )
    os.makedirs(f"{tmp}/run", mode=0o700, exist_ok=True)
    started = time.monotonic()
    subprocess.run(
        tmux
        + [
            "new-session",
            "-d",
            "-s",
            "tui",
            "-x",
            "80",
            "-y",
            "24",
            f"{env} exec {REPO / '.venv' / 'bin' / 'gpuwatch'} tui",
        ],
        check=True,
    )
    try:
        while time.monotonic() - started < 30:
            screen = subprocess.run(
                tmux + ["capture-pane", "-p", "-t", "tui"], capture_output=True, text=True
            ).stdout
            if sum("°C" in line for line in screen.splitlines()) == 8:
                return time.monotonic() - started
            time.sleep(0.02)
        raise SystemExit(f"the TUI never showed 8 GPUs:\n{screen}")
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--hang-at", type=float, default=5.0)
    ap.add_argument("--no-tui", action="store_true", help="skip the fresh-install TUI figure")
    ap.add_argument(
        "--busy", action="store_true", help="a thread in the daemon holds the GIL most of the time"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "gw.db")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                RUNNER,
                db,
                os.path.join(tmp, "s.sock"),
                str(args.interval),
                str(args.hang_at),
                "busy" if args.busy else "quiet",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        hang_ms = float(proc.stdout.readline()) * 1000
        time.sleep(args.seconds)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        conn = sqlite3.connect(db)
        host = [
            ts
            for (ts,) in conn.execute(
                "SELECT ts_ms FROM host_samples WHERE ts_ms >= ? ORDER BY ts_ms", (hang_ms,)
            )
        ]
        shown = conn.execute(
            "SELECT min(ts_ms) FROM gpu_samples WHERE gpu_index = ? AND state = 'hung'", (HUNG,)
        ).fetchone()[0]
        interval_ms = args.interval * 1000
        lateness, lost = [], 0
        for gpu in set(range(8)) - {HUNG}:
            ticks = [
                ts
                for (ts,) in conn.execute(
                    "SELECT ts_ms FROM gpu_samples WHERE gpu_index = ? AND "
                    "state IS NULL AND ts_ms >= ? ORDER BY ts_ms",
                    (gpu, hang_ms),
                )
            ]
            lost += len(set(host) - set(ticks))
            # Against the cadence set by the first tick after the hang (the scheduler's
            # deadlines are fixed steps of the interval).
            lateness += [ts - ticks[0] - round((ts - ticks[0]) / interval_ms) * interval_ms for ts in ticks]
        conn.close()
    lines = [line for line in stderr.splitlines() if f"GPU {HUNG}" in line]
    false = [line for line in stderr.splitlines() if "not responding" in line and f"GPU {HUNG} " not in line]
    print(
        f"load average {os.getloadavg()[0]:.2f}; interval {args.interval:g} s; GPU {HUNG} hung from "
        f"second {args.hang_at:g} of {args.seconds:g}; {len(host)} host ticks after the hang"
        f"{'; a thread of the daemon holds the GIL most of the time' if args.busy else ''}"
    )
    print(
        f"healthy GPUs' tick lateness: p50 {percentile(lateness, 50):.1f} ms, p99 {percentile(lateness, 99):.1f} ms "
        "(goal p99 <= 100 ms)"
    )
    print(f"samples lost on healthy GPUs: {lost} (goal 0)")
    if shown is None:
        print(f"GPU {HUNG} never shown as not responding")
    else:
        # The tick's sample is written once the call passed its deadline and a quiet window.
        shown += NVML_DEADLINE_SHARE * interval_ms + 1000 * min(
            QUIET_MAX_S, NVML_DEADLINE_SHARE * args.interval
        )
        print(
            f"time until GPU {HUNG} shown not responding: {(shown - hang_ms) / 1000:.2f} s = "
            f"{(shown - hang_ms) / interval_ms:.2f} intervals (goal <= 3)"
        )
    print(f"log lines about GPU {HUNG}: {len(lines)} ({'; '.join(line[3:80] for line in lines)})")
    print(f"'not responding' lines about the other GPUs: {len(false)} (goal 0)")
    if args.no_tui or shutil.which("tmux") is None:
        return
    times = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            times.append(tui_first_gpus_s(tmp))
    print(
        f"load average {os.getloadavg()[0]:.2f}; `gpuwatch tui` with no daemon and no database, "
        f"8 GPUs on screen after: {', '.join(f'{t:.2f}' for t in times)} s (goal <= 2 s)"
    )


if __name__ == "__main__":
    main()

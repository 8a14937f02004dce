"""Overload: a step() loop as fast as Python allows beside a real daemon, and a spool replay.

1. Flood: a child process calls run.step(tokens=256, loss=…) back to back for --seconds beside a
   real daemon (fake NVML, 8 GPUs, sampling at 10 Hz); it prints its peak RSS (ru_maxrss) every
   --every seconds, its own peak before gpuwatch.track() (the program's: with --torch, torch
   imported and a tensor loss), and finish()'s time.
   Then: steps/s offered vs stored (sum(n_steps)), tokens exact, rows written, the run's status,
   whether the end was stored by the time finish() returned.
2. Own spool: a client whose daemon went away spools --spool-events events, then replays them
   itself when the daemon is back: its peak RSS before and after (the peak that grew without
   bound came from replaying a spool whole).
3. Replay: a spool of --replay-events events left by a dead process, adopted by a fresh daemon
   sampling 8 fake GPUs at 10 Hz: how long it took, the daemon's sampling lateness meanwhile
   (gaps between GPU 0's samples beyond the 100 ms interval: p50/p99/max) and the "not
   responding" lines it logged.

Goals (issue 29): 0 steps uncounted, tokens exact, client peak RSS <= 150 MB (and a flat line
over time), end stored <= 1 s after finish(), 0 false "not responding" lines.

    .venv/bin/python bench/bench_overload.py [--seconds 600] [--every 30] [--torch]
        [--spool-events 300000] [--replay-events 1000000] [--skip-flood] [--skip-replay]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTROL_MAX_S = 120  # the idle control runs as long as the replay took, up to this
TESTS = ROOT / "tests"

DAEMON = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "spool_dir": sys.argv[3], "system": False,
            "interval": 0.1, "host_interval": 0.1, "spool_scan_interval": 1.0}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8)))
"""

FLOOD = """
import json, resource, sys, time
seconds, every, with_torch = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "torch"
loss = 2.5
if with_torch:  # a training script's footprint: torch imported, a tensor loss
    import torch
    loss = torch.tensor(2.5)
own_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import gpuwatch
run = gpuwatch.track(name="flood")
n, start = 0, time.perf_counter()
next_report = start + every
print(json.dumps({"own_mb": own_mb, "mode": run._transport.mode}), flush=True)
while True:
    for _ in range(1000):
        run.step(tokens=256, loss=loss)
    n += 1000
    now = time.perf_counter()
    if now >= next_report:
        print(json.dumps({"t": round(now - start), "steps": n,
                          "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
        next_report += every
    if now - start >= seconds:
        break
elapsed = time.perf_counter() - start
t0 = time.perf_counter()
run.finish()
print(json.dumps({"run_id": run.run_id, "steps": n, "elapsed": elapsed, "finish_s": time.perf_counter() - t0,
                  "dropped": run._transport.dropped,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
"""


def start_daemon(place: Path) -> subprocess.Popen:
    err = open(place / "daemon.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(place / "gw.db"), str(place / "gw.sock"), str(place / "spool")],
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    deadline = time.monotonic() + 60
    while not (place / "gw.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"daemon did not start: {(place / 'daemon.log').read_text()}")
        time.sleep(0.05)
    return proc


def stop_daemon(proc: subprocess.Popen, place: Path) -> list[str]:
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    return [line for line in (place / "daemon.log").read_text().splitlines() if "not responding" in line]


def flood(seconds: float, every: float, with_torch: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="gw-", dir="/tmp") as tmp:
        place = Path(tmp)
        daemon = start_daemon(place)
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            GPUWATCH_SOCKET=str(place / "gw.sock"),
            GPUWATCH_SPOOL_DIR=str(place / "spool"),
            XDG_DATA_HOME=str(place / "data"),
        )
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", FLOOD, str(seconds), str(every), "torch" if with_torch else "plain"],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            print(
                f"1. flood: run.step() back to back ({'tensor' if with_torch else 'float'} loss) for {seconds:g} s beside a daemon sampling 8 fake GPUs "
                f"at 10 Hz (load {os.getloadavg()[0]:.1f})"
            )
            print(f"   {'t (s)':>6} {'steps':>12} {'steps/s':>10} {'client peak RSS':>16}")
            lines = []
            for text in child.stdout:
                lines.append(json.loads(text))
                print_progress(lines[-1])
            child.wait()
            end = lines[-1]
            with sqlite3.connect(place / "gw.db") as conn:
                status, stored, tokens, rows = conn.execute(
                    "SELECT status, (SELECT sum(n_steps) FROM steps WHERE run_id = r.run_id), "
                    "(SELECT sum(tokens) FROM steps WHERE run_id = r.run_id), "
                    "(SELECT count(*) FROM steps WHERE run_id = r.run_id) FROM runs r WHERE run_id = ?",
                    (end["run_id"],),
                ).fetchone()
        finally:
            not_responding = stop_daemon(daemon, place)
        own = lines[0]["own_mb"]
        offered = end["steps"]
        exact = "exact" if tokens == 256 * offered else f"WRONG: {tokens} of {256 * offered}"
        print(
            f"   offered {end['steps']:,} steps ({end['steps'] / end['elapsed']:,.0f}/s); stored {stored or 0:,} "
            f"in {rows:,} rows; uncounted {end['steps'] - (stored or 0):,}; tokens "
            f"{exact}; "
            f"dropped {end['dropped']}"
        )
        print(
            f"   finish() {end['finish_s']:.2f} s, status read right after: {status} "
            f"({'met' if end['finish_s'] <= 1 and status == 'finished' else 'MISSED'}: end stored <= 1 s)"
        )
        print(
            f"   client peak RSS {end['peak_mb']:.0f} MB; the program's own before track() {own:.0f} MB: "
            f"+{end['peak_mb'] - own:.0f} MB ({'met' if end['peak_mb'] <= 150 else 'MISSED'}: <= 150 MB)"
        )
        print(f"   'not responding' lines: {len(not_responding)}")


def print_progress(line: dict) -> None:
    if "t" in line:
        print(
            f"   {line['t']:>6} {line['steps']:>12,} {line['steps'] / max(line['t'], 1):>10,.0f} "
            f"{line['peak_mb']:>13.0f} MB",
            flush=True,
        )


OWN_SPOOL = """
import json, resource, signal, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import test_transport as tt
from gpuwatch.client.transport import DaemonTransport
from gpuwatch.base.config import Config
n, place = int(sys.argv[1]), Path(sys.argv[3])
cfg = Config(db=str(place / "gw.db"), socket=str(place / "gw.sock"), spool_dir=str(place / "spool"))
daemon = tt.start_daemon(cfg)
t = DaemonTransport(cfg, cfg.socket_path, max_backoff=0.3)
t.send(tt.run_start())
assert t.flush()
daemon.kill()
daemon.wait()
for i in range(n):
    t.send(tt.step(i))
    if i % 5000 == 4999:
        t.flush()
t.flush()
spooled_mb = t.spool_path.stat().st_size / 2**20
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
daemon = tt.start_daemon(cfg)
while t.spool_path.exists():
    time.sleep(0.2)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t.close()
daemon.send_signal(signal.SIGTERM)
daemon.wait()
print(json.dumps({"spooled_mb": spooled_mb, "before": before, "after": after}))
"""


def own_spool(events: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gw-", dir="/tmp") as tmp:
        out = subprocess.run(
            [sys.executable, "-c", OWN_SPOOL, str(events), str(TESTS), tmp],
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            check=True,
        ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    print(
        f"2. own spool: {events:,} events spooled while the daemon was away ({r['spooled_mb']:.0f} MB), replayed "
        f"by the client: peak RSS {r['before']:.0f} MB before the replay, {r['after']:.0f} MB after "
        f"(+{r['after'] - r['before']:.0f} MB; load {os.getloadavg()[0]:.1f})"
    )


def sampling(
    place: Path, spool: Path | None, seconds: float | None
) -> tuple[float, int, list[int], list[str]]:
    """Run a daemon until the spool is gone (or for `seconds`): (seconds, steps stored, GPU 0's
    sampling lateness in ms per tick, its "not responding" lines)."""
    started_ms = int(time.time() * 1000)
    daemon = start_daemon(place)
    try:
        deadline = time.monotonic() + (3600 if seconds is None else seconds)
        while time.monotonic() < deadline and (spool is None or any(spool.iterdir())):
            time.sleep(1)
        took = time.time() - started_ms / 1000
        with sqlite3.connect(place / "gw.db") as conn:
            stored = conn.execute("SELECT count(*) FROM steps WHERE run_id = 'old'").fetchone()[0]
            ticks = [
                t
                for (t,) in conn.execute(
                    "SELECT ts_ms FROM gpu_samples WHERE gpu_index = 0 AND ts_ms >= ? ORDER BY ts_ms",
                    (started_ms,),
                )
            ]
    finally:
        not_responding = stop_daemon(daemon, place)
    late = sorted(max(0, b - a - 100) for a, b in zip(ticks, ticks[1:]))
    return took, stored, late, not_responding


def show_lateness(label: str, late: list[int], not_responding: list[str]) -> None:
    q = statistics.quantiles(late, n=100) if len(late) > 1 else [0] * 99
    print(
        f"   {label}: {len(late) + 1} samples of GPU 0; lateness beyond the 100 ms interval p50 {q[49]:.0f} ms, "
        f"p99 {q[98]:.0f} ms, max {late[-1] if late else 0} ms; 'not responding' lines {len(not_responding)}"
    )


def replay(events: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gw-", dir="/tmp") as tmp:
        place = Path(tmp)
        dead = subprocess.Popen(["true"])
        dead.wait()
        spool = place / "spool"
        spool.mkdir(mode=0o700)
        now = int(time.time() * 1000)
        with open(spool / f"{dead.pid}-bench.jsonl", "w") as f:
            f.write(
                json.dumps({"id": "s", "kind": "run_start", "run_id": "old", "ts_ms": now - events}) + "\n"
            )
            for i in range(1, events):
                f.write(
                    json.dumps(
                        {
                            "id": f"e{i}",
                            "kind": "step",
                            "run_id": "old",
                            "ts_ms": now - events + i,
                            "step": i,
                            "tokens": 256,
                            "loss": 1.0,
                            "step_time_ms": 2.0,
                        }
                    )
                    + "\n"
                )
        print(
            f"3. replay: a spool of {events:,} events adopted by a daemon sampling 8 fake GPUs at 10 Hz "
            f"(load {os.getloadavg()[0]:.1f}), then the same daemon idle as long, up to {CONTROL_MAX_S} s (the control)"
        )
        took, stored, late, not_responding = sampling(place, spool, None)
        print(f"   {stored:,} of {events - 1:,} steps stored in {took:.0f} s ({stored / took:,.0f} events/s)")
        show_lateness("during the replay", late, not_responding)
        for line in not_responding[:4]:
            print(f"     {line}")
    with tempfile.TemporaryDirectory(prefix="gw-", dir="/tmp") as tmp:
        _, _, late, not_responding = sampling(Path(tmp), None, min(took, CONTROL_MAX_S))
        show_lateness(f"idle, no replay (load {os.getloadavg()[0]:.1f})", late, not_responding)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--spool-events", type=int, default=300_000)
    parser.add_argument("--replay-events", type=int, default=1_000_000)
    parser.add_argument("--torch", action="store_true", help="import torch first and pass a tensor loss")
    parser.add_argument("--skip-flood", action="store_true")
    parser.add_argument("--skip-replay", action="store_true")
    args = parser.parse_args()
    if not args.skip_flood:
        flood(args.seconds, args.every, args.torch)
    if not args.skip_replay:
        own_spool(args.spool_events)
        replay(args.replay_events)


if __name__ == "__main__":
    main()

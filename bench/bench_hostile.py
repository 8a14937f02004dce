"""The daemon under attack: frames turned away, its RSS, tick lateness, log volume; a pinned WAL.

Runs the real daemon in its own process (8 simulated GPUs, tests/fake_pynvml.py) and attacks
its socket from other processes with malformed frames of every sort (random bytes, deep
nesting, wrong types, unhashable kinds, huge numbers and strings, invalid UTF-8, half frames,
hang-ups). Meanwhile one honest client of another uid steps a run, one step a frame. Then one
uid floods valid events from many connections while the other uid steps again.

    .venv/bin/python bench/bench_hostile.py [--seconds 30] [--attackers 4]

Prints: frames/s answered with an error, daemon RSS before and after, how late its sampling
ticks were during the attack (goal p99 <= 100 ms), the other uid's ack latency, the log lines
and bytes written per minute of attack, and the log lines an hour of that attack costs under
the throttle (goal <= 120). Then a reader pins the WAL for 600 sampling ticks (10 minutes at
1 Hz, run at 100 Hz) and lets go: peak WAL and WAL after release (goal <= 4 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
RUNNER = f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
interval = float(sys.argv[3])
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "interval": interval, "host_interval": interval,
            "system": True, "rate_limit_events": int(sys.argv[4])}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8)))
"""

ATTACKER = textwrap.dedent("""
    import json, os, random, socket, sys, time
    path, until = sys.argv[1], float(sys.argv[2])
    rnd = random.Random(os.getpid())
    def junk():
        pick = rnd.randrange(10)
        if pick == 0: return bytes(rnd.randrange(256) for _ in range(rnd.randrange(300))).replace(b"\\n", b"") + b"\\n"
        if pick == 1: return b'{"v":1,"type":"events","events":' + b"[" * rnd.choice([40, 5000, 100000]) + b"\\n"
        if pick == 2: return json.dumps({"v": 1, "type": "events", "events": [{"kind": {"a": [1]}}]}).encode() + b"\\n"
        if pick == 3: return json.dumps({"v": 1, "type": "events", "events": [
            {"id": "x", "kind": "step", "run_id": "r", "ts_ms": 10**30, "step": "s"}]}).encode() + b"\\n"
        if pick == 4: return b'{"v":1,"type":"hello","client":"' + b"\\xff" * 1000 + b'"}\\n'
        if pick == 5: return b'{"v":1,"type":"hello","client":' + b"9" * 4000 + b"}\\n"
        if pick == 6: return json.dumps({"v": rnd.random(), "type": [1]}).encode() + b"\\n"
        if pick == 7: return json.dumps({"v": 1, "type": "control_request", "action": {}}).encode() + b"\\n"
        if pick == 8: return b'{"v":1,"type":"events","events":[{"id":"\\\\ud800","kind":"step"}]}\\n'
        return b'{"v":1,"type":"events","events":[{"id":"a","kind":"step","run_id":"r","ts_ms":1,"step":0}]}\\n'
    answered = 0
    while time.time() < until:
        s = socket.socket(socket.AF_UNIX); s.connect(path); f = s.makefile("rb")
        frames = [junk() for _ in range(50)]
        s.sendall(b'{"v":1,"type":"hello"}\\n' + b"".join(frames))
        if rnd.random() < 0.2:
            s.close(); continue  # a hang-up without reading
        for _ in range(len(frames) + 1):
            line = f.readline()
            if not line: break
            answered += b'"type":"error"' in line
        s.sendall(b'{"v":1,"type":"ev')  # half a frame, then gone
        s.close()
    print(answered)
""")

VICTIM = textwrap.dedent("""
    import json, os, socket, sys, time
    os.setgid(65534); os.setgroups([]); os.setuid(65534)
    path, until = sys.argv[1], float(sys.argv[2])
    s = socket.socket(socket.AF_UNIX); s.connect(path); f = s.makefile("rb")
    def rt(frame):
        s.sendall(json.dumps(dict(frame, v=1)).encode() + b"\\n"); return json.loads(f.readline())
    rt({"type": "hello"})
    rt({"type": "events", "events": [{"id": "v", "kind": "run_start", "run_id": "victim", "ts_ms": 1}]})
    waits, i = [], 0
    while time.time() < until:
        t = time.perf_counter()
        rt({"type": "events", "events": [{"id": f"v{i}", "kind": "step", "run_id": "victim",
                                          "ts_ms": 2 + i, "step": i}]})
        waits.append(time.perf_counter() - t); i += 1
        time.sleep(0.05)
    print(json.dumps(waits))
""")


FLOOD = textwrap.dedent("""
    import json, socket, sys, threading
    def flood(k):
        s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
        s.sendall(b'{"v":1,"type":"hello"}\\n'); f.readline()
        n = 0
        while True:
            batch = [{"id": f"f{k}-{n}-{i}", "kind": "step", "run_id": "flood", "ts_ms": 1, "step": n * 1000 + i,
                      "tokens": 4096, "step_time_ms": 10.0} for i in range(1000)]
            s.sendall(json.dumps({"v": 1, "type": "events", "events": batch}).encode() + b"\\n")
            if json.loads(f.readline())["type"] != "ack": return
            n += 1
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
    s.sendall(b'{"v":1,"type":"hello"}\\n{"v":1,"type":"events","events":[{"id":"fs","kind":"run_start",'
              b'"run_id":"flood","ts_ms":1}]}\\n'); f.readline(); f.readline()
    for k in range(int(sys.argv[2])):
        threading.Thread(target=flood, args=(k,), daemon=True).start()
    threading.Event().wait()
""")


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


def tick_lateness_ms(db: str, since_ms: int, until_ms: int, interval_ms: float) -> list[float]:
    """How late each GPU tick in the window was against the schedule its first tick set."""
    conn = sqlite3.connect(db)
    ts = [
        t
        for (t,) in conn.execute(
            "SELECT DISTINCT ts_ms FROM gpu_samples WHERE gpu_index = 0 "
            "AND ts_ms BETWEEN ? AND ? ORDER BY ts_ms",
            (since_ms, until_ms),
        )
    ]
    conn.close()
    if len(ts) < 2:
        return []
    # Each tick's phase within the interval; on time is the phase just after the widest gap
    # between phases (a monotonic schedule: ticks are on time or late, never early).
    phases = sorted((t - ts[0]) % interval_ms for t in ts)
    gaps = [(phases[(i + 1) % len(phases)] - p) % interval_ms for i, p in enumerate(phases)]
    on_time = phases[(gaps.index(max(gaps)) + 1) % len(phases)]
    return [((t - ts[0]) % interval_ms - on_time) % interval_ms for t in ts]


def throttled_lines_per_hour(codes: int) -> int:
    """Lines an hour of errors of `codes` kinds, each every second, cost under the throttle."""
    from gpuwatch.daemon.logging import Throttle

    now = [0.0]
    lines = []

    class Sink:
        def log(self, *args, **kw):
            lines.append(args)

    throttle = Throttle(Sink(), clock=lambda: now[0])
    for second in range(3600):
        now[0] = float(second)
        for code in range(codes):
            throttle.log((1000, code), 30, "x")
    return len(lines)


def attack(args, tmp: str) -> None:
    db, sock = os.path.join(tmp, "a.db"), os.path.join(tmp, "a.sock")
    log_path = os.path.join(tmp, "daemon.log")
    interval = 0.1
    with open(log_path, "w") as log_file:
        daemon = subprocess.Popen(
            [sys.executable, "-c", RUNNER, db, sock, str(interval), "5000"], stderr=log_file
        )
    try:
        while not os.path.exists(sock):
            time.sleep(0.1)
        time.sleep(3)
        rss_before = rss_mb(daemon.pid)
        log_before = Path(log_path).read_text()
        start_ms, until = int(time.time() * 1000), time.time() + args.seconds
        attackers = [
            subprocess.Popen(
                [sys.executable, "-c", ATTACKER, sock, str(until)], stdout=subprocess.PIPE, text=True
            )
            for _ in range(args.attackers)
        ]
        victim = subprocess.Popen(
            [sys.executable, "-c", VICTIM, sock, str(until)], stdout=subprocess.PIPE, text=True
        )
        answered = sum(int(a.communicate()[0] or 0) for a in attackers)
        waits = json.loads(victim.communicate()[0])
        end_ms = int(time.time() * 1000)
        rss_after = rss_mb(daemon.pid)
        log = Path(log_path).read_text()[len(log_before) :]
    finally:
        daemon.terminate()
        daemon.wait(30)
    late = tick_lateness_ms(db, start_ms, end_ms, interval * 1000)
    minutes = args.seconds / 60
    lines = [line for line in log.splitlines() if line]
    codes = {line.split(": ")[3] for line in lines if "ingest: uid" in line and line.count(": ") >= 4}
    print(f"attack: {args.attackers} processes of malformed frames for {args.seconds:g} s")
    print(f"  frames answered with an error: {answered / args.seconds:,.0f}/s ({answered:,} in all)")
    print(f"  daemon RSS: {rss_before:.1f} MB before, {rss_after:.1f} MB after")
    if late:
        print(
            f"  sampling ticks ({interval:g} s interval) late by: p50 {pct(late, 0.5):.0f} ms, "
            f"p99 {pct(late, 0.99):.0f} ms, max {max(late):.0f} ms (goal p99 <= 100 ms)"
        )
    print(
        f"  another uid's ack latency: p50 {pct(waits, 0.5) * 1000:.1f} ms, p99 {pct(waits, 0.99) * 1000:.1f} ms "
        f"({len(waits)} frames)"
    )
    print(
        f"  log: {len(lines) / minutes:.1f} lines/min, {len(log.encode()) / minutes:,.0f} bytes/min "
        f"({len(lines)} lines, error codes seen: {', '.join(sorted(codes)) or '-'})"
    )
    print(
        f"  an hour of it under the throttle: {throttled_lines_per_hour(len(codes))} lines "
        f"({len(codes)} codes, each erring every second; goal <= 120)"
    )
    if any("Traceback" in line for line in lines):
        print("  TRACEBACKS IN THE LOG")


def flood(args, tmp: str) -> None:
    db, sock = os.path.join(tmp, "f.db"), os.path.join(tmp, "f.sock")
    daemon = subprocess.Popen([sys.executable, "-c", RUNNER, db, sock, "1.0", "0"], stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(sock):
            time.sleep(0.1)
        flooder = subprocess.Popen([sys.executable, "-c", FLOOD, sock, str(args.flooders)])
        time.sleep(2)
        until = time.time() + args.seconds / 2
        victim = subprocess.run(
            [sys.executable, "-c", VICTIM, sock, str(until)], capture_output=True, text=True
        )
        flooder.kill()
        flooder.wait()
        waits = json.loads(victim.stdout)
        stored = (
            sqlite3.connect(db).execute("SELECT count(*) FROM steps WHERE run_id = 'flood'").fetchone()[0]
        )
    finally:
        daemon.terminate()
        daemon.wait(30)
    print(f"flood: {args.flooders} connections of one uid sending valid 1000-event frames, no rate limit")
    print(
        f"  another uid's ack latency: p50 {pct(waits, 0.5) * 1000:.1f} ms, p99 {pct(waits, 0.99) * 1000:.1f} ms "
        f"({len(waits)} frames; {stored / (2 + args.seconds / 2):,.0f} flood events/s stored)"
    )


def pinned_wal(tmp: str, ticks: int) -> None:
    from gpuwatch.store.writer import wal_bytes

    db, sock = os.path.join(tmp, "w.db"), os.path.join(tmp, "w.sock")
    interval = 0.01
    daemon = subprocess.Popen(
        [sys.executable, "-c", RUNNER, db, sock, str(interval), "5000"], stderr=subprocess.DEVNULL
    )
    try:
        while not os.path.exists(sock):
            time.sleep(0.1)
        time.sleep(2)
        reader = sqlite3.connect(db, isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM gpu_samples").fetchone()
        peak = 0
        deadline = time.monotonic() + ticks * interval
        while time.monotonic() < deadline:
            peak = max(peak, wal_bytes(db))
            time.sleep(0.1)
        reader.execute("COMMIT")
        reader.close()
        time.sleep(12)  # two housekeeping periods
        after = wal_bytes(db)
        db_size = os.path.getsize(db)
    finally:
        daemon.terminate()
        daemon.wait(30)
    print(
        f"pinned WAL: {ticks} sampling ticks of 8 GPUs under one read transaction "
        f"(10 min at 1 Hz, run at {1 / interval:g} Hz)"
    )
    print(
        f"  WAL peak {peak / 1e6:.1f} MB; {after / 1e6:.2f} MB 12 s after the reader let go "
        f"(database {db_size / 1e6:.1f} MB; goal <= 4 MB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the attack")
    parser.add_argument("--attackers", type=int, default=4, help="attacking processes")
    parser.add_argument("--ticks", type=int, default=600, help="sampling ticks under a pinned reader")
    parser.add_argument("--flooders", type=int, default=16, help="connections of the flooding uid")
    args = parser.parse_args()
    random.seed(1)
    with tempfile.TemporaryDirectory(prefix="gw-hostile-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)  # the other uid must reach the socket
        attack(args, tmp)
        flood(args, tmp)
        pinned_wal(tmp, args.ticks)


if __name__ == "__main__":
    main()

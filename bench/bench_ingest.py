"""Events/s through the daemon's socket into SQLite vs raw executemany of the same rows.

The daemon is the real one (run_daemon, a subprocess); several client connections send
batched step events and wait for each ack (= committed). The raw figure inserts the same
rows into the same schema with executemany, 1000 rows per transaction. Goal: socket >= 20 %
of raw. Usage: .venv/bin/python bench/bench_ingest.py [--clients 4] [--events 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuwatch import protocol
from gpuwatch.store import open_rw
from gpuwatch.store.writer import insert_sql

DAEMON = """
import sys
from gpuwatch.base.config import Config
from gpuwatch.daemon.main import run_daemon
sys.exit(run_daemon(Config(db=sys.argv[1], socket=sys.argv[2], system=False, interval=60.0,
                           host_interval=60.0, process_interval=60.0, rate_limit_events=10**9)))
"""
BATCH = protocol.MAX_EVENTS_PER_BATCH


def step_event(run_id: str, i: int) -> dict:
    return {
        "id": f"{run_id}-{i}",
        "kind": "step",
        "run_id": run_id,
        "ts_ms": 1_700_000_000_000 + i,
        "step": i,
        "tokens": 32768,
        "samples": 8,
        "seq_len": 4096,
        "loss": 2.5,
        "step_time_ms": 120.5,
        "tokens_per_s": 271_934.0,
        "mem_allocated_bytes": 40 << 30,
        "mem_reserved_bytes": 44 << 30,
        "mem_peak_bytes": 42 << 30,
    }


def raw_rate(path: Path, runs: list[str], n: int) -> float:
    conn = open_rw(path)
    columns = [c for c in step_event("x", 0) if c not in ("id", "kind")]
    sql = insert_sql("steps", columns, "IGNORE")
    batches = [
        [
            tuple(v for k, v in step_event(r, i).items() if k not in ("id", "kind"))
            for i in range(start, min(n, start + BATCH))
        ]
        for r in runs
        for start in range(0, n, BATCH)
    ]
    started = time.perf_counter()
    for rows in batches:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return len(runs) * n / elapsed


def client(sock_path: Path, run_id: str, n: int, frames_out: list) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(sock_path))
    f = sock.makefile("rb")

    def rt(frame: bytes) -> dict:
        sock.sendall(frame)
        return json.loads(f.readline())

    rt(protocol.encode({"type": "hello", "client": "bench"}))
    start = {"id": f"{run_id}-start", "kind": "run_start", "run_id": run_id, "ts_ms": 1}
    assert rt(protocol.encode({"type": "events", "events": [start]}))["type"] == "ack"
    frames = [
        protocol.encode(
            {"type": "events", "events": [step_event(run_id, i) for i in range(s, min(n, s + BATCH))]}
        )
        for s in range(0, n, BATCH)
    ]
    frames_out.append((sock, f, rt, frames))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def socket_rate(sock_path: Path, runs: list[str], n: int) -> float:
    ready: list = []
    for run_id in runs:
        client(sock_path, run_id, n, ready)
    failures = []

    def send_all(rt, frames):
        for frame in frames:
            reply = rt(frame)
            if reply["type"] != "ack":
                failures.append(reply)

    threads = [threading.Thread(target=send_all, args=(rt, frames)) for _, _, rt, frames in ready]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    for sock, f, _, _ in ready:
        f.close()
        sock.close()
    if failures:
        raise SystemExit(f"daemon refused batches: {failures[0]}")
    return len(runs) * n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--events", type=int, default=50_000, help="step events per client")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-bench-", dir="/tmp"))
    runs = [f"run{i}" for i in range(args.clients)]

    raw = raw_rate(work / "raw.db", runs, args.events)

    db, sock_path = work / "daemon.db", work / "gw.sock"
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(db), str(sock_path)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while not sock_path.exists():
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise SystemExit("daemon did not start")
            time.sleep(0.05)
        cpu_before = cpu_seconds(daemon.pid)
        via_socket = socket_rate(sock_path, runs, args.events)
        daemon_cpu_s = cpu_seconds(daemon.pid) - cpu_before
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
    stored = open_rw(db).execute("SELECT count(*) FROM steps").fetchone()[0]
    if stored != args.clients * args.events:
        raise SystemExit(f"expected {args.clients * args.events} steps stored, found {stored}")

    print(
        f"cpus: {os.cpu_count()}  clients: {args.clients}  events: {args.clients * args.events} "
        f"(step events, {BATCH} per batch)"
    )
    print(f"raw executemany into SQLite:      {raw:12,.0f} events/s")
    print(f"through the socket (acked=commit): {via_socket:12,.0f} events/s")
    print(f"ratio socket/raw: {via_socket / raw:.1%}  (goal >= 20%)")
    total = args.clients * args.events
    print(
        f"daemon CPU per event: {daemon_cpu_s / total * 1e6:.1f} us (all its threads); "
        f"raw executemany wall per event: {1e6 / raw:.1f} us; load average {os.getloadavg()[0]:.1f}"
    )
    subprocess.run(["rm", "-rf", str(work)], check=False)


if __name__ == "__main__":
    main()

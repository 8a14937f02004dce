"""Checks that apply on any machine: host figures, the database, the daemon's socket, py-spy."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuwatch.selftest.result import FAIL, OK, SKIPPED, Result, within

MiB = 2**20

_DAEMON = """
import sys
from gpuwatch.base.config import Config
from gpuwatch.daemon.main import run_daemon
sys.exit(run_daemon(Config(db=sys.argv[1], socket=sys.argv[2], system=False, interval=5.0,
                           host_interval=5.0, process_interval=30.0)))
"""
_TRACKED = """
import gpuwatch
with gpuwatch.track(name="selftest-socket") as run:
    for _ in range(3):
        run.step(tokens=128, samples=1, seq_len=128)
print(run.run_id)
"""
_SLEEPER = """
import time
def selftest_waits_here():
    time.sleep(60)
print("ready", flush=True)
selftest_waits_here()
"""


def host_memory() -> list[Result]:
    import psutil

    from collectors.host import HostCollector

    collector = HostCollector()
    ours = collector.sample(0)
    theirs = psutil.virtual_memory()
    return [
        within("host memory total", ours.mem_total_bytes // MiB, theirs.total // MiB, 0, "MiB", "exact"),
        within(
            "host memory available",
            ours.mem_available_bytes / MiB,
            theirs.available / MiB,
            max(64, theirs.available / MiB * 0.02),
            "MiB",
            "64 MiB or 2 %",
        ),
    ]


def database() -> list[Result]:
    """A real file in WAL mode: written by the writer's path, read back read-only, intact."""
    from gpuwatch.store import insert_rows, open_ro, open_rw
    from gpuwatch.store.schema import SCHEMA_VERSION

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "selftest.db"
        conn = open_rw(path)
        with conn:
            insert_rows(
                conn,
                "runs",
                [{"run_id": "selftest", "uid": os.getuid(), "status": "finished", "started_ms": 1}],
            )
        conn.close()
        ro = open_ro(path)
        try:
            version = ro.execute("PRAGMA user_version").fetchone()[0]
            integrity = ro.execute("PRAGMA integrity_check").fetchone()[0]
            found = ro.execute("SELECT count(*) FROM runs WHERE run_id = 'selftest'").fetchone()[0]
        finally:
            ro.close()
    ok = (version, integrity, found) == (SCHEMA_VERSION, "ok", 1)
    return [
        Result(
            "database round trip",
            OK if ok else FAIL,
            f"schema v{version} (this gpuwatch: v{SCHEMA_VERSION}), integrity {integrity}, "
            f"{found} row read back",
        )
    ]


def daemon_socket() -> list[Result]:
    """A daemon of our own on a temporary socket: a tracked run's steps arrive, acknowledged, with
    the uid the socket says (never the message's)."""
    base = Path(tempfile.mkdtemp(prefix="gw-selftest-"))
    db, sock = base / "gw.db", base / "gw.sock"
    daemon = subprocess.Popen(
        [sys.executable, "-c", _DAEMON, str(db), str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                error = (
                    daemon.stderr.read().decode().strip().splitlines() if daemon.poll() is not None else []
                )
                return [
                    Result(
                        "daemon socket round trip",
                        FAIL,
                        f"the daemon did not listen: {error[-1] if error else 'timed out'}",
                    )
                ]
            time.sleep(0.05)
        env = dict(os.environ, GPUWATCH_SOCKET=str(sock))
        env.pop("GPUWATCH_RUN_ID", None)
        child = subprocess.run(
            [sys.executable, "-c", _TRACKED], env=env, capture_output=True, text=True, timeout=60
        )
        run_id = (
            child.stdout.strip().splitlines()[-1] if child.returncode == 0 and child.stdout.strip() else None
        )
        if run_id is None:
            last = (child.stderr.strip().splitlines() or ["no output"])[-1]
            return [Result("daemon socket round trip", FAIL, f"the tracked run failed: {last}")]
        from gpuwatch.store import open_ro

        conn = open_ro(db)
        try:
            uid, mode = conn.execute("SELECT uid, mode FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            steps = conn.execute("SELECT sum(n_steps) FROM steps WHERE run_id = ?", (run_id,)).fetchone()[0]
        finally:
            conn.close()
        ok = (steps, uid, mode) == (3, os.getuid(), "daemon")
        return [
            Result(
                "daemon socket round trip",
                OK if ok else FAIL,
                f"{steps} of 3 steps stored, uid {uid} (ours {os.getuid()}), mode {mode}",
            )
        ]
    finally:
        daemon.terminate()
        daemon.wait(10)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def py_spy() -> list[Result]:
    from collectors.pyspy import dump, ptrace_problem

    child = subprocess.Popen([sys.executable, "-c", _SLEEPER], stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        problem = ptrace_problem(child.pid)
        if problem:
            return [Result("py-spy stack dump", SKIPPED, problem)]
        result = dump(child.pid, 0)
        if result.error:
            return [
                Result(
                    "py-spy stack dump", SKIPPED if "not installed" in result.error else FAIL, result.error
                )
            ]
        names = {f.get("name") for t in result.threads for f in t.get("frames", [])}
        found = "selftest_waits_here" in names
        return [
            Result(
                "py-spy stack dump",
                OK if found else FAIL,
                "found the frame the child waits in" if found else f"frames seen: {sorted(names)[:5]}",
            )
        ]
    finally:
        child.kill()
        child.wait()


CHECKS = [
    ("host figures vs psutil", host_memory),
    ("database", database),
    ("daemon socket", daemon_socket),
    ("py-spy", py_spy),
]

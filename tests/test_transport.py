"""The client transport: embedded mode, daemon mode, and a daemon that dies mid-run."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpuwatch.base.config import Config
from gpuwatch.client.transport import DaemonTransport, connect

DAEMON = """
import logging, sys
from gpuwatch.base.config import Config
from gpuwatch.daemon.main import run_daemon
logging.basicConfig(level=logging.INFO)
sys.exit(run_daemon(Config(db=sys.argv[1], socket=sys.argv[2], system=False, interval=5.0,
                           host_interval=5.0, process_interval=30.0)))
"""


@pytest.fixture
def cfg():
    path = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))  # short: socket paths are capped
    yield Config(db=str(path / "gpuwatch.db"), socket=str(path / "gw.sock"))
    subprocess.run(["rm", "-rf", str(path)], check=False)


def start_daemon(cfg: Config) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(cfg.db_path), str(cfg.socket_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited: {proc.stderr.read().decode()}")
        if connect_probe(cfg):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("daemon did not listen in time")


def connect_probe(cfg: Config) -> bool:
    import socket

    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(cfg.socket_path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def run_start(run_id="r1"):
    return {
        "id": f"{run_id}-start",
        "kind": "run_start",
        "run_id": run_id,
        "ts_ms": int(time.time() * 1000),
        "name": "test",
        "config": {"lr": 0.1},
    }


def step(i, run_id="r1"):
    return {
        "id": f"{run_id}-{i}",
        "kind": "step",
        "run_id": run_id,
        "ts_ms": int(time.time() * 1000),
        "step": i,
        "tokens": 128,
    }


def rows(cfg, sql, *args):
    with sqlite3.connect(cfg.db_path) as conn:
        return conn.execute(sql, args).fetchall()


def test_an_embedded_request_is_answered_once_its_events_are_committed(cfg):
    t = connect(cfg)
    assert t.mode == "embedded"
    reply = t.request({"type": "events", "events": [run_start(), step(0)]})
    assert reply == {"v": 1, "type": "ack", "ids": ["r1-start", "r1-0"]}
    assert rows(cfg, "SELECT run_id, step FROM steps") == [("r1", 0)]  # acknowledged: committed
    t.writer.close()
    assert t.request({"type": "events", "events": [step(1)]})["code"] == "busy"  # refused, not waited on
    t.close()


def test_embedded_mode_without_a_daemon_writes_the_same_tables(cfg):
    t = connect(cfg)
    assert t.mode == "embedded"
    t.send(run_start())
    for i in range(5):
        t.send(step(i))
    t.send(
        {
            "id": "m",
            "kind": "memory_stats",
            "run_id": "r1",
            "ts_ms": 1,
            "step": 4,
            "num_alloc_retries": 0,
            "stats": {"num_ooms": 0},
        }
    )
    t.send({"id": "end", "kind": "run_end", "run_id": "r1", "ts_ms": 2, "status": "finished", "exit_code": 0})
    t.send({"id": "bad", "kind": "step", "run_id": "r1", "ts_ms": 3, "step": -1})
    assert t.flush()
    assert (
        t.request({"type": "control_request", "run_id": "r1", "action": "profile"})["code"] == "unavailable"
    )
    t.close()
    assert t.rejected == 1
    assert rows(cfg, "SELECT uid, pid, status, mode, config_json FROM runs") == [
        (os.getuid(), os.getpid(), "finished", "embedded", '{"lr":0.1}')
    ]
    assert rows(cfg, "SELECT count(*), sum(tokens) FROM steps") == [(5, 640)]
    assert rows(cfg, "SELECT step, stats_json FROM memory_stats") == [(4, '{"num_ooms":0}')]


def test_embedded_mode_marks_runs_of_dead_processes_lost(cfg):
    """No daemon watches the embedded database: opening it again finds the run a killed process left."""
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import os, signal
from gpuwatch.client.transport import connect
from gpuwatch.base.config import Config
t = connect(Config(db={str(cfg.db_path)!r}, socket={str(cfg.socket_path)!r}))
t.send({run_start("dead")!r}); t.send({step(0, "dead")!r}); t.flush()
os.kill(os.getpid(), signal.SIGKILL)
""",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -9, child.stderr
    assert rows(cfg, "SELECT status FROM runs WHERE run_id = 'dead'") == [("running",)]
    t = connect(cfg)
    assert t.flush()
    t.close()
    assert rows(cfg, "SELECT status, ended_ms IS NOT NULL FROM runs WHERE run_id = 'dead'") == [("lost", 1)]


def test_daemon_stops_cleanly_with_clients_connected(cfg):
    import signal
    import socket

    daemon = start_daemon(cfg)
    client = socket.socket(socket.AF_UNIX)
    client.connect(str(cfg.socket_path))
    client.sendall(b'{"v":1,"type":"hello"}\n')
    assert b"welcome" in client.recv(4096)
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=20) == 0
    client.close()
    stderr = daemon.stderr.read().decode()
    assert "Exception" not in stderr and "<3>" not in stderr, stderr


def test_daemon_mode_round_trip_and_control(cfg):
    daemon = start_daemon(cfg)
    try:
        t = connect(cfg)
        assert t.mode == "daemon"
        got = []
        t.control_handler = got.append
        assert t.request({"type": "events", "events": [run_start()]})["type"] == "ack"
        for i in range(100):
            t.send(step(i))
        t.send({"id": "bad", "kind": "step", "run_id": "r1", "ts_ms": 3, "step": -1})
        t.send_many([step(i) for i in range(100, 200)])  # a drain's steps at once
        assert t.flush()
        assert rows(cfg, "SELECT count(*) FROM steps") == [(200,)]  # acked = committed
        assert t.rejected == 1  # the daemon refused the bad one alone
        reply = t.request({"type": "control_request", "run_id": "r1", "action": "profile", "steps": 3})
        assert reply["type"] == "control_result"
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        assert got == [{"v": 1, "type": "control", "run_id": "r1", "action": "profile", "steps": 3}]
        t.close()
        assert rows(cfg, "SELECT uid, pid, mode FROM runs") == [(os.getuid(), os.getpid(), "daemon")]
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0
    assert not cfg.socket_path.exists()  # SIGTERM stopped the ingest and removed its socket


def test_daemon_killed_and_restarted_mid_run_loses_nothing_and_counts_nothing_twice(cfg):
    daemon = start_daemon(cfg)
    t = connect(cfg, max_backoff=0.3)
    assert isinstance(t, DaemonTransport)
    t.send(run_start())
    for i in range(30):
        t.send(step(i))
    assert t.flush()
    daemon.send_signal(signal.SIGKILL)
    daemon.wait()
    for i in range(30, 60):
        t.send(step(i))
    assert t.flush()  # spooled
    assert t.spool_path.exists()
    assert [json.loads(line)["step"] for line in t.spool_path.read_text().splitlines()] == list(range(30, 60))
    daemon = start_daemon(cfg)  # removes the stale socket the killed one left
    try:
        for i in range(60, 90):
            t.send(step(i))
        t.send({"id": "end", "kind": "run_end", "run_id": "r1", "ts_ms": 5, "status": "finished"})
        deadline = time.monotonic() + 15
        while t.spool_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert t.flush()
        t.close()
        assert not t.spool_path.exists()
        assert rows(cfg, "SELECT step FROM steps ORDER BY step") == [(i,) for i in range(90)]
        assert rows(cfg, "SELECT status FROM runs") == [("finished",)]
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def test_a_dead_process_spool_is_replayed_by_the_next_client(cfg, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    spool = tmp_path / "data" / "gpuwatch" / "spool"
    spool.mkdir(parents=True)
    lines = [run_start("orphan")] + [step(i, "orphan") for i in range(3)]
    (spool / f"{dead.pid}-abcd.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    daemon = start_daemon(cfg)
    try:
        t = connect(cfg)
        t.close()
        assert os.listdir(spool) == []
        assert rows(cfg, "SELECT run_id, count(*) FROM steps GROUP BY run_id") == [("orphan", 3)]
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def test_send_never_blocks_and_counts_what_it_drops(cfg):
    daemon = start_daemon(cfg)
    try:
        t = connect(cfg, queue_size=5)
        assert t.request({"type": "events", "events": [run_start()]})["type"] == "ack"
        started = time.perf_counter()
        for i in range(5000):
            t.send(step(i))
        for first in range(5000, 10_000, 100):  # a drain's steps at a time
            t.send_many([step(i) for i in range(first, first + 100)])
        elapsed = time.perf_counter() - started
        t.close()
        stored = rows(cfg, "SELECT count(*) FROM steps")[0][0]
        assert t.dropped > 0
        assert stored + t.dropped == 10_000  # every event is either stored or counted as dropped
        assert elapsed < 5  # a daemon round trip per event would take far longer
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def test_a_second_daemon_on_the_same_socket_refuses_in_one_line(cfg):
    daemon = start_daemon(cfg)
    try:
        second = subprocess.run(
            [sys.executable, "-c", DAEMON, str(cfg.db_path), str(cfg.socket_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"another daemon is already listening on {cfg.socket_path}" in second.stderr
        assert "Traceback" not in second.stderr
        t = connect(cfg)
        assert t.mode == "daemon"  # the first one still serves
        t.close()
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0

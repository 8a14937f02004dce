"""The socket ingest with a real Unix socket, a real Writer on a real SQLite file, real peers."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.base.config import Config
from gpuwatch.base.pids import process_alive
from gpuwatch.base.unix_socket import SocketError
from gpuwatch.daemon.ingest import IngestServer
from gpuwatch.monitor.runs_watch import RunsWatch
from gpuwatch.store import Writer

NOBODY = 65534


class Server:
    """An IngestServer on its own loop thread, as the daemon runs it."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.writer = Writer(cfg.db_path)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.ingest = IngestServer(cfg, self.writer)
        try:
            self.call(self.ingest.start())
        except BaseException:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.writer.close()
            raise

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self):
        self.call(self.ingest.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.writer.close()


@pytest.fixture
def shared_dir():
    """A short, world-traversable directory: another uid must reach the socket."""
    path = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def server(shared_dir):
    cfg = Config(
        db=str(shared_dir / "gpuwatch.db"),
        socket=str(shared_dir / "run" / "gw.sock"),
        system=True,
        rate_limit_events=100_000,
    )
    srv = Server(cfg)
    yield srv
    srv.close()


class Client:
    def __init__(self, path, hello=True):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        if hello:
            assert self.rt({"v": 1, "type": "hello", "client": "test"})["type"] == "welcome"

    def send_raw(self, data: bytes):
        self.sock.sendall(data)

    def read(self) -> dict | None:
        line = self.file.readline()
        return json.loads(line) if line else None

    def rt(self, frame: dict) -> dict:
        self.send_raw(json.dumps(frame).encode() + b"\n")
        return self.read()

    def close(self):
        self.file.close()
        self.sock.close()


def events(*evs):
    return {"v": 1, "type": "events", "events": list(evs)}


def run_start(run_id="r1", **extra):
    return {"id": f"start-{run_id}", "kind": "run_start", "run_id": run_id, "ts_ms": 1000, **extra}


def step(i, run_id="r1"):
    return {
        "id": f"{run_id}-s{i}",
        "kind": "step",
        "run_id": run_id,
        "ts_ms": 2000 + i,
        "step": i,
        "tokens": 4096,
        "step_time_ms": 10.0,
    }


def db(cfg) -> sqlite3.Connection:
    return sqlite3.connect(cfg.db_path)


def test_round_trip_acks_only_committed_events(server):
    c = Client(server.cfg.socket_path)
    reply = c.rt(events(run_start(name="gpt-4k", config={"lr": 3e-4}), *[step(i) for i in range(5)]))
    assert reply == {"v": 1, "type": "ack", "ids": ["start-r1"] + [f"r1-s{i}" for i in range(5)]}
    # Acked means committed: a separate connection sees every row at once.
    with db(server.cfg) as conn:
        assert conn.execute("SELECT count(*), sum(tokens) FROM steps").fetchone() == (5, 5 * 4096)
        name, config, status, mode, last = conn.execute(
            "SELECT name, config_json, status, mode, last_step_ms FROM runs"
        ).fetchone()
    assert (name, json.loads(config), status, mode, last) == (
        "gpt-4k",
        {"lr": 3e-4},
        "running",
        "daemon",
        2004,
    )
    c.close()


def test_identity_comes_from_the_socket_not_the_message(server):
    c = Client(server.cfg.socket_path)
    reply = c.rt(events(run_start(uid=1234, user="mallory", pid=1)))
    assert reply["type"] == "ack"
    assert "events[0].uid: ignored (identity comes from the socket)" in reply["warnings"]
    with db(server.cfg) as conn:
        row = conn.execute("SELECT uid, pid FROM runs WHERE run_id = 'r1'").fetchone()
    assert row == (os.getuid(), os.getpid())


def test_replayed_events_are_not_counted_twice(server):
    c = Client(server.cfg.socket_path)
    batch = events(run_start(), *[step(i) for i in range(10)])
    assert c.rt(batch)["type"] == "ack"
    assert c.rt(batch)["type"] == "ack"  # a client that never saw the first ack sends again
    end = {"id": "end", "kind": "run_end", "run_id": "r1", "ts_ms": 9000, "status": "finished"}
    assert c.rt(events(end))["type"] == "ack"
    assert c.rt(events(end))["type"] == "ack"
    with db(server.cfg) as conn:
        assert conn.execute("SELECT count(*) FROM steps").fetchone() == (10,)
        assert conn.execute("SELECT count(*), status, ended_ms FROM runs").fetchone() == (1, "finished", 9000)


def test_a_frame_our_code_fails_on_is_internal_one_the_disk_refuses_is_store(server, monkeypatch, caplog):
    import gpuwatch.daemon.ingest as ingest

    real = ingest.apply_events

    def apply_events(db, evs, peer):
        if evs[0]["run_id"] == "ours":
            raise KeyError("a bug of ours")
        if evs[0]["run_id"] == "disk":
            raise sqlite3.OperationalError("disk I/O error")  # what SQLite says when the disk fails
        return real(db, evs, peer)

    monkeypatch.setattr(ingest, "apply_events", apply_events)
    c = Client(server.cfg.socket_path)
    bug = c.rt(events(run_start("ours")))
    assert bug["code"] == "internal" and "(KeyError, logged); do not resend it" in bug["error"]
    disk = c.rt(events(run_start("disk")))
    assert disk["code"] == "store"
    assert disk["error"] == "database write failed (disk I/O error); keep the events and retry later"
    assert c.rt(events(run_start("fine")))["type"] == "ack"
    with db(server.cfg) as conn:
        assert conn.execute("SELECT run_id FROM runs").fetchall() == [("fine",)]
    # Our bug is logged once, by ingest, with the frame's first bytes; the writer adds nothing.
    bugs = [r for r in caplog.records if r.exc_info and r.exc_info[0] is KeyError]
    assert [r.getMessage().split(", first bytes")[0] for r in bugs] == [
        f"ingest: storing a frame from uid {os.getuid()} pid {os.getpid()} failed"
    ]
    c.close()


def test_bad_frames_get_clear_errors_and_the_server_keeps_serving(server):
    path = server.cfg.socket_path
    c = Client(path)
    reply = c.rt({"v": 1, "type": "events", "events": [step(0)] + [dict(step(1), tokens="abc")]})
    assert reply["code"] == "invalid"
    assert reply["error"] == "events[1].tokens: expected integer >= 0, got 'abc'"
    c.send_raw(b"this is not json\n")
    assert c.read()["error"].startswith("frame is not JSON")
    assert c.rt({"v": 7, "type": "hello"})["error"] == "unsupported protocol version 7; this daemon speaks 1"
    assert c.rt(events(step(0)))["code"] == "unknown_run"  # the same connection still answers
    c.close()

    early = Client(path, hello=False)
    assert early.rt(events(run_start()))["error"] == "send hello before events"
    early.close()

    oversized = Client(path)
    try:
        oversized.send_raw(b'{"v":1,"type":"events","events":["' + b"x" * (5 * 1024 * 1024))
    except BrokenPipeError:
        pass  # the server stopped reading once the cap was passed; its reply is waiting
    reply = oversized.read()
    assert reply["code"] == "too_large" and "bytes without a newline" in reply["error"]
    assert oversized.read() is None  # and the connection is closed
    oversized.close()

    truncated = Client(path)
    truncated.send_raw(b'{"v":1,"type":"events","ev')
    truncated.sock.shutdown(socket.SHUT_WR)
    assert truncated.read()["error"] == "truncated frame: the stream ended before its newline"
    truncated.close()

    good = Client(path)
    assert good.rt(events(run_start(), step(0)))["type"] == "ack"
    good.close()
    with db(server.cfg) as conn:
        assert conn.execute("SELECT count(*) FROM steps").fetchone() == (1,)


CHILD = textwrap.dedent("""
    import json, os, socket, sys
    os.setgid(65534); os.setgroups([]); os.setuid(65534)
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
    def rt(frame):
        s.sendall(json.dumps(dict(frame, v=1)).encode() + b"\\n"); return json.loads(f.readline())
    out = [rt({"type": "hello"})]
    out.append(rt({"type": "events", "events": [
        {"id": "x1", "kind": "step", "run_id": "r1", "ts_ms": 5, "step": 99, "uid": 0}]}))
    out.append(rt({"type": "events", "events": [
        {"id": "x2", "kind": "run_start", "run_id": "r1", "ts_ms": 5}]}))
    out.append(rt({"type": "events", "events": [
        {"id": "x3", "kind": "run_end", "run_id": "r1", "ts_ms": 5, "status": "killed"}]}))
    out.append(rt({"type": "control_request", "run_id": "r1", "action": "profile", "steps": 3}))
    print(json.dumps(out))
""")


def test_another_uid_cannot_write_to_or_control_a_run(server):
    owner = Client(server.cfg.socket_path)
    assert owner.rt(events(run_start(), step(0)))["type"] == "ack"
    assert stat.S_IMODE(os.stat(server.cfg.socket_path).st_mode) == 0o666  # system mode: everyone
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(server.cfg.socket_path)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    hello, step_reply, start_reply, end_reply, control_reply = json.loads(done.stdout)
    assert hello["uid"] == NOBODY
    assert step_reply["code"] == "forbidden" and step_reply["ids"] == []
    assert step_reply["error"] == "event 'x1': run 'r1' belongs to uid 0; uid 65534 may not write to it"
    assert (
        start_reply["code"] == "forbidden" and "already exists and belongs to uid 0" in start_reply["error"]
    )
    assert end_reply["code"] == "forbidden"
    assert control_reply["code"] == "forbidden"
    with db(server.cfg) as conn:
        assert conn.execute("SELECT step FROM steps").fetchall() == [(0,)]
        assert conn.execute("SELECT uid, status FROM runs").fetchall() == [(0, "running")]
    owner.close()


def test_control_reaches_the_connection_that_feeds_the_run(server):
    path = server.cfg.socket_path
    workload = Client(path)
    assert workload.rt(events(run_start()))["type"] == "ack"
    cli = Client(path)
    reply = cli.rt({"v": 1, "type": "control_request", "run_id": "r1", "action": "profile", "steps": 4})
    assert reply == {"v": 1, "type": "control_result", "run_id": "r1", "action": "profile", "delivered": True}
    assert workload.read() == {"v": 1, "type": "control", "run_id": "r1", "action": "profile", "steps": 4}
    assert (
        cli.rt({"v": 1, "type": "control_request", "run_id": "nope", "action": "profile"})["code"]
        == "unknown_run"
    )
    workload.close()
    deadline = time.monotonic() + 5
    while "r1" in server.ingest.run_connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (
        cli.rt({"v": 1, "type": "control_request", "run_id": "r1", "action": "profile"})["code"]
        == "not_connected"
    )
    cli.close()


def test_rate_limit_per_uid(shared_dir):
    cfg = Config(db=str(shared_dir / "g.db"), socket=str(shared_dir / "gw.sock"), rate_limit_events=10)
    srv = Server(cfg)
    try:
        c = Client(cfg.socket_path)
        assert c.rt(events(run_start(), *[step(i) for i in range(999)]))["type"] == "ack"  # one burst
        reply = c.rt(events(step(1000)))
        assert reply["code"] == "rate_limited" and reply["error"] == "rate limit exceeded"
        assert reply["retry_after_ms"] > 0
        c.close()
    finally:
        srv.close()


def test_socket_modes_stale_socket_and_a_second_daemon(shared_dir):
    cfg = Config(db=str(shared_dir / "g.db"), socket=str(shared_dir / "user" / "gw.sock"))
    stale = socket.socket(socket.AF_UNIX)
    cfg.socket_path.parent.mkdir()
    stale.bind(str(cfg.socket_path))  # bound, never listening: what a crashed daemon leaves
    stale.close()
    srv = Server(cfg)
    try:
        assert stat.S_IMODE(os.stat(cfg.socket_path).st_mode) == 0o600  # user mode: only me
        assert os.listdir(cfg.socket_path.parent) == ["gw.sock"]  # no bind leftovers
        with pytest.raises(SocketError, match="another daemon is already listening on"):
            Server(cfg)
    finally:
        srv.close()
    assert not cfg.socket_path.exists()


def test_lost_runs_are_marked_with_last_seen_time(server):
    c = Client(server.cfg.socket_path)
    now = int(time.time() * 1000)
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert c.rt(events(run_start("alive", ts_ms=now)))["type"] == "ack"  # pid = this test process
    c.close()
    with db(server.cfg) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, uid, pid, host, started_ms, last_step_ms) "
            "VALUES ('dead', 0, ?, ?, 1000, 5000)",
            (dead.pid, socket.gethostname()),
        )
        # Our pid, but a run that started long before this process did: the pid was reused.
        conn.execute(
            "INSERT INTO runs (run_id, uid, pid, host, started_ms) VALUES ('reused', 0, ?, ?, 1000)",
            (os.getpid(), socket.gethostname()),
        )
    watch = RunsWatch(server.writer, alive=process_alive)
    lost: list = []
    server.writer.submit(lambda conn: lost.extend(watch.check(conn)))
    server.writer.flush()
    assert sorted(lost) == ["dead", "reused"]
    with db(server.cfg) as conn:
        rows = dict(conn.execute("SELECT run_id, status || ':' || COALESCE(ended_ms, '') FROM runs"))
    assert rows == {"alive": "running:", "dead": "lost:5000", "reused": "lost:1000"}


def test_a_mixed_batch_lands_row_for_row_and_a_stranger_run_is_refused_alone(server):
    """One frame of every table kind, nulls here and there, and steps for a run that never
    started in the middle: the good rows land exactly, the strangers are named."""
    c = Client(server.cfg.socket_path)
    mem = {"kind": "memory_stats", "run_id": "r1", "ts_ms": 3000, "num_ooms": 0}
    batch = [
        run_start(),
        step(0),
        dict(step(1), loss=2.5),
        dict(step(2), loss=None, tokens=None),
        {"id": "m0", **mem, "step": 0, "stats": {"num_ooms": 0}},
        {"id": "m1", **mem, "step": 0, "device": 1, "stats": None},  # device null above: default 0
        step(0, run_id="r9"),
        step(1, run_id="r9"),
        {
            "id": "ev",
            "kind": "run_event",
            "run_id": "r1",
            "ts_ms": 3500,
            "seq": 0,
            "event_kind": "checkpoint",
            "payload": {"path": "/ckpt/1"},
        },
        {"id": "g0", "kind": "generation", "run_id": "r1", "ts_ms": 3600, "gen_id": 0, "ttft_ms": 12.5},
        step(3),
    ]
    reply = c.rt(events(*batch))
    assert reply["code"] == "unknown_run"
    assert reply["error"] == ("event 'r9-s0': run 'r9' is unknown (its run_start never arrived) (and 1 more)")
    assert reply["rejected"] == ["r9-s0", "r9-s1"]
    assert reply["ids"] == [e["id"] for e in batch if e["run_id"] == "r1"]
    with db(server.cfg) as conn:
        assert conn.execute(
            "SELECT step, tokens, loss, step_time_ms FROM steps ORDER BY step"
        ).fetchall() == [
            (0, 4096, None, 10.0),
            (1, 4096, 2.5, 10.0),
            (2, None, None, 10.0),
            (3, 4096, None, 10.0),
        ]
        assert conn.execute(
            "SELECT device, num_ooms, stats_json FROM memory_stats ORDER BY device"
        ).fetchall() == [(0, 0, '{"num_ooms":0}'), (1, 0, None)]
        assert conn.execute("SELECT seq, kind, payload_json FROM run_events").fetchall() == [
            (0, "checkpoint", '{"path":"/ckpt/1"}')
        ]
        assert conn.execute("SELECT gen_id, ttft_ms FROM generations").fetchall() == [(0, 12.5)]
        assert conn.execute("SELECT last_step_ms FROM runs").fetchall() == [(2003,)]
    # Same number of fields, not the same fields: each lands in its own column.
    assert c.rt(events(dict(step(4), loss=1.5), dict(step(5), mfu=0.5)))["type"] == "ack"
    with db(server.cfg) as conn:
        assert conn.execute("SELECT step, loss, mfu FROM steps WHERE step >= 4").fetchall() == [
            (4, 1.5, None),
            (5, None, 0.5),
        ]
    # The whole frame again: nothing counted twice.
    assert c.rt(events(*batch))["ids"] == reply["ids"]
    with db(server.cfg) as conn:
        assert conn.execute(
            "SELECT (SELECT count(*) FROM steps) + (SELECT count(*) FROM memory_stats) + "
            "(SELECT count(*) FROM run_events) + (SELECT count(*) FROM generations)"
        ).fetchone() == (10,)
    c.close()

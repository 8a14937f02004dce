"""Hostile clients against the real ingest server: a real Unix socket, a real Writer, a real file.

Every frame is answered (an ack, or an error with a known code and one line), no traceback
reaches the log, the database stays intact, and the next honest client is served.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from systools import wait_for
from test_ingest import Client, Server, events, run_start, shared_dir, step  # noqa: F401 (fixture)

from gpuwatch import protocol
from gpuwatch.base.config import Config

# Another uid's ack, one step a frame, while this uid floods with 1000-event frames.
ACK_BOUND_S = 0.5  # on a 2-core CI machine busy with the rest of the suite
sys.path.insert(0, str(REPO / "bench"))


class Records(logging.Handler):
    """Every record the daemon's loggers emit during a test."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def tracebacks(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.fixture
def records():
    handler = Records()
    logger = logging.getLogger("gpuwatch")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture
def open_server(shared_dir):  # noqa: F811
    """No rate limit: every frame reaches validation and the store."""
    cfg = Config(
        db=str(shared_dir / "gpuwatch.db"),
        socket=str(shared_dir / "gw.sock"),
        system=True,
        rate_limit_events=0,
    )
    srv = Server(cfg)
    yield srv
    srv.close()


# --- what a hostile client sends ------------------------------------------------------------


def _line(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode() + b"\n"


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.sampled_from(["", "x" * 5000, "step", "run_start", "r1", "\x00", "\ud800", "é" * 100]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def event(draw):
    """An event of a real kind whose fields hold anything: right, wrong, huge, null."""
    kind = draw(st.sampled_from(list(protocol.EVENT_KINDS)))
    specs = {**protocol.COMMON_FIELDS, **protocol.EVENT_KINDS[kind]}
    ev = {
        "id": draw(st.text(min_size=1, max_size=12)),
        "kind": kind,
        "run_id": "r1",
        "ts_ms": draw(st.integers(0, 2**64)),
    }
    for name in draw(st.lists(st.sampled_from(list(specs)), max_size=3)):
        ev[name] = draw(scalars)
    if draw(st.booleans()):
        ev[draw(st.sampled_from(["uid", "colour", "", "x" * 300]))] = draw(values)  # an unknown field
    return ev


def _nested(depth: int, leaf="1") -> str:
    return "[" * depth + leaf + "]" * depth


def _as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else _line(value)


frames = st.one_of(
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"") + b"\n"),  # random bytes
    values.map(_line),  # any JSON
    st.fixed_dictionaries({"v": values, "type": values}).map(_line),  # a wrong envelope
    st.lists(event(), min_size=1, max_size=3).map(lambda evs: _line(events(*evs))),
    st.builds(
        lambda k, v: _line({"v": 1, "type": "events", "events": [dict(step(0), **{k: v})]}),
        st.sampled_from(list({**protocol.COMMON_FIELDS, **protocol.EVENT_KINDS["step"]})),
        values,
    ),
    st.builds(
        lambda a, r, s: _line({"v": 1, "type": "control_request", "action": a, "run_id": r, "steps": s}),
        values,
        values,
        values,
    ),
    st.integers(10, 100_000).map(lambda n: f'{{"v":1,"type":"events","events":{_nested(n)}}}\n'.encode()),
    st.integers(25, 40).map(
        lambda n: (
            '{"v":1,"type":"events","events":[{"id":"c","kind":"run_start",'
            f'"run_id":"r1","ts_ms":1,"config":{{"a":{_nested(n)}}}}}]}}\n'
        ).encode()
    ),
    st.integers(1, 5000).map(
        lambda n: f'{{"v":1,"type":"hello","client":{"9" * n}}}\n'.encode()
    ),  # huge number
    st.sampled_from(
        [
            b'{"v":1,"type":"hello","client":"\xff\xfe"}\n',  # invalid UTF-8
            b'{"v":1,"type":"hello","client":"\\udc00"}\n',  # a lone surrogate
            b'{"v":1,"type":"hello","client":1e999}\n',
            b'{"v":NaN}\n',
            b"\n",
            b" \n",
            b'{"v":1,"type":"events","events":[{"kind":{"a":1}}]}\n',
            b'{"v":1,"type":"events","events":[{"kind":[1]}]}\n',
        ]
    ),
)


@st.composite
def session(draw):
    """A connection's worth of frames, then maybe half a frame, then a close or a hang-up."""
    hello = draw(st.booleans())
    sent = draw(st.lists(frames, min_size=80, max_size=90))
    tail = draw(
        st.one_of(st.none(), st.binary(min_size=1, max_size=200).map(lambda b: b.replace(b"\n", b"")))
    )
    ending = draw(st.sampled_from(["read", "read", "hang_up"]))
    return hello, sent, tail or None, ending


def _check_reply(reply: dict) -> None:
    assert reply.get("type") in ("ack", "welcome", "error", "control_result"), reply
    if reply["type"] == "error":
        assert reply["code"] in protocol.ERROR_CODES, reply
        assert reply["code"] != "internal", reply  # our own bug: the fuzz found one
        assert "\n" not in reply["error"] and len(reply["error"]) < 1000, reply


@pytest.mark.slow(12)
def test_fuzzing_the_socket_answers_every_frame_and_logs_no_traceback(open_server, records):
    srv = open_server
    honest = Client(srv.cfg.socket_path)
    assert honest.rt(events(run_start("r1")))["type"] == "ack"  # a real run the fuzz can hit
    counted = []

    @settings(max_examples=126, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(session())
    def attack(one):
        hello, sent, tail, ending = one
        c = Client(srv.cfg.socket_path, hello=hello)
        c.send_raw(b"".join(sent) + (tail or b""))
        if ending == "hang_up":  # gone without reading a reply: the daemon must not mind
            c.sock.close()
            counted.append(len(sent))
            return
        for _ in sent:
            reply = c.read()
            assert reply is not None, "the daemon closed a connection without answering"
            _check_reply(reply)
        if tail:  # half a frame, then the end of the stream: a `truncated` reply and a close
            c.sock.shutdown(socket.SHUT_WR)
            assert c.read()["code"] == "truncated"
            assert c.read() is None
        c.close()
        counted.append(len(sent) + bool(tail))

    attack()
    assert sum(counted) >= 10_000
    # The honest client's connection lived through it all, and a new one is served.
    assert honest.rt(events(step(0)))["type"] == "ack"
    fresh = Client(srv.cfg.socket_path)
    assert fresh.rt(events(step(1)))["type"] == "ack"
    assert records.tracebacks() == []
    assert srv.writer.failed_jobs == 0
    with sqlite3.connect(srv.cfg.db_path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT step FROM steps WHERE run_id = 'r1' AND step IN (0, 1)").fetchall() == [
            (0,),
            (1,),
        ]
    # What the admin reads: a handful of lines for thousands of bad frames.
    assert 0 < len(records.records) < 40


def test_oversized_and_slow_frames_are_answered_then_closed(open_server, records, monkeypatch):
    from gpuwatch.daemon import ingest

    path = open_server.cfg.socket_path
    big = Client(path)
    try:
        big.send_raw(b'{"v":1,"type":"hello","client":"' + b"x" * (protocol.MAX_FRAME_BYTES + 10))
    except BrokenPipeError:
        pass
    assert big.read()["code"] == "too_large"
    assert big.read() is None
    big.close()

    monkeypatch.setattr(ingest, "FRAME_TIMEOUT_S", 0.5)
    slow = Client(path)
    slow.send_raw(b'{"v":1,"type":"hel')  # and nothing more: a slow loris
    started = time.monotonic()
    reply = slow.read()
    assert reply["code"] == "timeout" and time.monotonic() - started < 5
    assert slow.read() is None
    slow.close()
    assert open_server.ingest.uids == {} or all(
        u.pending_bytes == 0 for u in open_server.ingest.uids.values()
    )
    assert records.tracebacks() == []


# --- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MB tmpfs for the database. It needs root (CI runs as root and must not skip)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)], capture_output=True
        ).returncode
        == 0
    )
    if not mounted:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root and must be able to mount a tmpfs for the disk-full test")
        pytest.skip("mounting a 6 MB tmpfs needs root (CI runs this test)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


class Filler(threading.Thread):
    """Another process's file that takes every byte the filesystem frees, until stopped."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.halt = threading.Event()
        self.full = threading.Event()

    def run(self):
        with open(self.path, "wb", buffering=0) as f:
            while not self.halt.is_set():
                try:
                    f.write(b"\0" * 4096)
                except OSError:
                    self.full.set()
                    time.sleep(0.002)

    def stop(self):
        self.halt.set()
        self.join(5)
        os.unlink(self.path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_full_disk_is_one_warning_a_visible_state_and_no_lost_event(
    small_disk,
    shared_dir,  # noqa: F811
    records,
    monkeypatch,
):
    import asyncio
    import urllib.request

    import fake_pynvml
    from click.testing import CliRunner

    import gpuwatch
    from gpuwatch.cli import main as cli
    from gpuwatch.daemon.main import Daemon
    from gpuwatch.selftest.doctor import FAIL, Env, check_daemon
    from gpuwatch.store import health

    db, sock = str(small_disk / "gpuwatch.db"), shared_dir / "gw.sock"
    port = _free_port()
    cfg = Config(
        db=db,
        socket=str(sock),
        interval=0.05,
        host_interval=0.05,
        rate_limit_events=0,
        metrics_listen=f"127.0.0.1:{port}",
    )
    daemon = Daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8))
    thread = threading.Thread(target=lambda: asyncio.run(daemon.serve()))
    thread.start()
    monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
    filler = Filler(small_disk / "filler")
    try:
        wait_for(sock.exists)
        run = gpuwatch.track(name="through-a-full-disk")
        assert run._transport.mode == "daemon"
        for _ in range(20):
            run.step(tokens=10)
        assert run._transport.flush(10)

        filler.start()
        trouble = wait_for(lambda: health.read(db, [sock]))
        assert trouble.problem == "disk full" and trouble.path == db
        for _ in range(30):  # the daemon answers `store`: the client keeps these spooled
            run.step(tokens=10)
            time.sleep(0.02)
        run._drain(wait=True)
        assert run._transport.flush(10)
        assert run._transport._spool_exists()  # refused with `store`, kept on the client's disk
        wait_for(lambda: daemon.writer.health.failed_jobs >= 40)  # many failed commits...

        out = CliRunner().invoke(cli, ["status", "--db", db]).output
        assert f"WARNING: the daemon cannot write {db}: disk full" in out
        doctor = {c.name: c for c in check_daemon(Env(socket_path=sock, db_path=Path(db)), None)}
        assert doctor["database writes"].status == FAIL and "disk full" in doctor["database writes"].detail
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "gpuwatch_daemon_store_writable 0.0" in metrics
        dropped = [
            line for line in metrics.splitlines() if line.startswith("gpuwatch_daemon_dropped_samples_total ")
        ]
        assert float(dropped[0].split()[1]) > 0

        filler.stop()  # space comes back: everything resumes by itself
        wait_for(lambda: health.read(db, [sock]) is None and daemon.writer.health is None)
        for _ in range(10):
            run.step(tokens=10)
        run.finish()  # flushes and closes the transport: the spool is replayed
        steps = lambda: sqlite3.connect(db).execute("SELECT count(*), sum(tokens) FROM steps").fetchone()  # noqa: E731
        assert wait_for(lambda: steps() == (60, 600), timeout=30)
        with sqlite3.connect(db) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
            assert conn.execute("SELECT status FROM runs").fetchall() == [("finished",)]
    finally:
        if filler.is_alive():
            filler.stop()
        daemon.request_stop()
        thread.join(15)
    warnings = [r.getMessage() for r in records.records if r.getMessage().startswith("store: cannot write")]
    assert len(warnings) == 1, warnings  # one warning for the whole episode, not one per commit
    assert "disk full" in warnings[0] and db in warnings[0] and "bytes free" in warnings[0]
    assert any(r.getMessage().startswith(f"store: writing {db} again") for r in records.records)
    assert records.tracebacks() == []


# --- a pinned WAL -----------------------------------------------------------------------------


def test_a_reader_pinning_the_wal_is_reported_once_and_the_wal_shrinks_after(tmp_path, records, monkeypatch):
    from gpuwatch.daemon.metrics import StoreCollector
    from gpuwatch.store import Writer
    from gpuwatch.store import writer as writer_mod
    from gpuwatch.tui.snapshot import View
    from gpuwatch.tui.source import StoreSource

    monkeypatch.setattr(writer_mod, "HOUSEKEEPING_S", 0.2)
    monkeypatch.setattr(writer_mod, "WAL_LIMIT_BYTES", 2 * 1024 * 1024)
    db = str(tmp_path / "gpuwatch.db")
    writer = Writer(db)
    wal = lambda: writer_mod.wal_bytes(db)  # noqa: E731
    try:
        writer.submit(lambda c: c.execute("CREATE TABLE blobs (b BLOB)"))

        def fill(megabytes: int):
            for _ in range(megabytes):
                writer.submit(
                    lambda c: c.executemany("INSERT INTO blobs VALUES (?)", [(os.urandom(4096),)] * 256)
                )
            assert writer.flush(30)

        # Our own readers, left open as the TUI and /metrics leave them: they pin nothing.
        source, collector = StoreSource(db), StoreCollector(db)
        source.fetch(View("overview"))
        list(collector.collect())
        fill(4)
        wait_for(lambda: wal() == 0, timeout=10)

        pinned = sqlite3.connect(db, isolation_level=None)
        pinned.execute("BEGIN")
        pinned.execute("SELECT count(*) FROM blobs").fetchone()  # holds its snapshot from here
        for _ in range(3):
            fill(2)
            time.sleep(0.5)  # housekeeping runs in between
        assert wal() > 4 * 1024 * 1024
        warned = [r for r in records.records if "cannot be checkpointed" in r.getMessage()]
        assert len(warned) == 1 and db in warned[0].getMessage()

        pinned.execute("COMMIT")  # the reader is done
        pinned.close()
        wait_for(lambda: wal() < writer_mod.WAL_LIMIT_BYTES, timeout=10)
        assert wal() == 0
        # The log line follows the checkpoint, on the writer's thread: wait for it too.
        wait_for(
            lambda: any("checkpointed and cut back" in r.getMessage() for r in records.records), timeout=10
        )
        source.close()
        collector.close()
    finally:
        writer.close()
    assert records.tracebacks() == []


# --- greedy clients ---------------------------------------------------------------------------

VICTIM = textwrap.dedent("""
    import json, os, socket, sys, time
    os.setgid(65534); os.setgroups([]); os.setuid(65534)
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rb")
    def rt(frame):
        s.sendall(json.dumps(dict(frame, v=1)).encode() + b"\\n"); return json.loads(f.readline())
    assert rt({"type": "hello"})["type"] == "welcome"
    assert rt({"type": "events", "events": [
        {"id": "v-start", "kind": "run_start", "run_id": "victim", "ts_ms": 1}]})["type"] == "ack"
    waits = []
    for i in range(int(sys.argv[2])):
        t = time.perf_counter()
        reply = rt({"type": "events", "events": [
            {"id": f"v{i}", "kind": "step", "run_id": "victim", "ts_ms": 2 + i, "step": i, "tokens": 1}]})
        waits.append(time.perf_counter() - t)
        assert reply["type"] == "ack", reply
        time.sleep(0.01)
    print(json.dumps(waits))
""")


@pytest.mark.slow
def test_one_uid_flooding_does_not_hold_up_another_uids_acks(open_server):
    from bench_hostile import FLOOD  # the bench's flooding process: 1000-event frames, many connections

    srv = open_server
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(srv.cfg.socket_path), "16"])
    try:
        wait_for(
            lambda: (
                sqlite3.connect(srv.cfg.db_path)
                .execute("SELECT count(*) FROM steps WHERE run_id = 'flood'")
                .fetchone()[0]
                >= 16_000
            )
        )  # flowing
        done = subprocess.run(
            [sys.executable, "-c", VICTIM, str(srv.cfg.socket_path), "150"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        waits = sorted(json.loads(done.stdout))
    finally:
        flood.kill()
        flood.wait()
    with sqlite3.connect(srv.cfg.db_path) as conn:
        flooded = conn.execute("SELECT count(*) FROM steps WHERE run_id = 'flood'").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM steps WHERE run_id = 'victim'").fetchone() == (150,)
    p99 = waits[int(len(waits) * 0.99) - 1]
    assert p99 < ACK_BOUND_S, f"p99 {p99 * 1000:.0f} ms while {flooded} flood events were stored"


def test_idle_and_slow_loris_connections_hold_bounded_memory_and_block_no_one(open_server):
    from gpuwatch.daemon import ingest

    srv = open_server
    idle = []
    for _ in range(1000):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(srv.cfg.socket_path))
        idle.append(s)
    # Slow lorises: each sends most of a big frame and then nothing.
    lorises = []
    for _ in range(12):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(str(srv.cfg.socket_path))
        s.settimeout(10)
        try:
            s.sendall(b'{"v":1,"type":"hello","client":"' + b"x" * (3 * 1024 * 1024))
        except (BrokenPipeError, ConnectionResetError):
            pass
        lorises.append(s)
    try:
        started = time.monotonic()
        fresh = Client(srv.cfg.socket_path)  # a new client is served at once
        assert fresh.rt(events(run_start("new")))["type"] == "ack"
        assert time.monotonic() - started < 5
        uid_state = srv.call(_state_of(srv, os.getuid()))
        assert uid_state <= ingest.UID_PENDING_BYTES
        refused = 0
        for s in lorises:  # those past the uid's budget were answered `busy` and closed
            s.settimeout(0.2)
            try:
                data = s.recv(4096)
            except socket.timeout:
                continue
            if data:
                assert json.loads(data.split(b"\n")[0])["code"] == "busy"
                refused += 1
        assert refused >= 12 - ingest.UID_PENDING_BYTES // (3 * 1024 * 1024)
        fresh.close()
    finally:
        for s in idle + lorises:
            s.close()


async def _state_of(srv, uid):
    state = srv.ingest.uids.get(uid)
    return 0 if state is None else state.pending_bytes


# --- the log policy ---------------------------------------------------------------------------


def test_the_throttle_says_each_recurring_error_once_a_minute_then_less_with_a_count():
    from gpuwatch.daemon.logging import Throttle

    now = [0.0]
    logger = logging.getLogger("gpuwatch.test_throttle")
    handler = Records()
    logger.addHandler(handler)
    try:
        throttle = Throttle(logger, clock=lambda: now[0])
        for second in range(3600):  # an hour of one bad frame a second from uid 1000
            now[0] = float(second)
            throttle.log((1000, "invalid"), logging.WARNING, "uid %d: invalid: %s", 1000, "bad")
        lines = [r.getMessage() for r in handler.records]
        assert lines[0] == "uid 1000: invalid: bad"
        assert lines[1] == "uid 1000: invalid: bad (59 more since the last such line)"  # a minute on
        assert len(lines) <= 12
        assert sum(int(line.split("(")[1].split()[0]) for line in lines[1:]) + len(lines) <= 3600
        throttle.log((1001, "invalid"), logging.WARNING, "another uid")  # its own key: said at once
        assert handler.records[-1].getMessage() == "another uid"
        now[0] += 1300  # quiet for two periods: the next one is said again at once, period reset
        assert throttle.log((1000, "invalid"), logging.WARNING, "again")
        now[0] += 61
        assert throttle.log((1000, "invalid"), logging.WARNING, "again")
    finally:
        logger.removeHandler(handler)


# --- the database file deleted or replaced; the TUI's banner -----------------------------------


def test_a_database_deleted_or_replaced_while_open_is_noticed_and_writing_goes_on(
    tmp_path, records, monkeypatch
):
    from gpuwatch.store import Writer, open_rw
    from gpuwatch.store import writer as writer_mod

    monkeypatch.setattr(writer_mod, "HOUSEKEEPING_S", 0.1)
    db = tmp_path / "gpuwatch.db"
    writer = Writer(db)
    note = lambda text: writer.submit(  # noqa: E731
        lambda c: c.execute(
            "INSERT INTO run_events (run_id, ts_ms, seq, kind) VALUES ('r', 1, ?, ?)", (len(text), text)
        )
    )
    try:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)  # an admin's rm
        wait_for(lambda: db.exists())  # noticed, and a new database made at that path
        note("after delete")
        assert writer.flush(10)
        assert sqlite3.connect(db).execute("SELECT kind FROM run_events").fetchall() == [("after delete",)]

        other = tmp_path / "restored.db"
        open_rw(other).close()
        other.replace(db)  # a backup restored over it
        time.sleep(0.5)
        note("after replace!")
        assert writer.flush(10)
        assert sqlite3.connect(db).execute("SELECT kind FROM run_events").fetchall() == [("after replace!",)]
    finally:
        writer.close()
    lines = [r.getMessage() for r in records.records if r.levelno == logging.WARNING]
    assert [line.split(" while open")[0] for line in lines] == [
        f"store: {db} was deleted",
        f"store: {db} was replaced",
    ]
    assert records.tracebacks() == []


def test_the_tui_says_why_the_daemon_cannot_write(tmp_path):
    from gpuwatch.base import paths
    from gpuwatch.store import health, open_rw
    from gpuwatch.tui.panels import status_line
    from gpuwatch.tui.snapshot import View
    from gpuwatch.tui.source import StoreSource

    db = tmp_path / "gpuwatch.db"
    open_rw(db).close()
    sock = paths.default_socket_path(False)
    sock.parent.mkdir(parents=True, exist_ok=True)
    report = health.StoreHealth(
        str(db), "disk full", "database or disk is full", 1, 0, failed_jobs=7, pid=os.getpid()
    )
    health.publish(sock, report)
    source = StoreSource(str(db))
    try:
        line = status_line(source.fetch(View("overview")))[0].plain
        assert line.startswith(f"⚠ the daemon cannot write {db}: disk full") and "0 bytes free" in line
        health.publish(sock, None)
        assert "cannot write" not in status_line(source.fetch(View("overview")))[0].plain
    finally:
        source.close()

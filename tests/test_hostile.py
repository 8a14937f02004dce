"""Hostile clients against the real ingest server: a real Unix socket, a real Writer, a real file.

Every frame is answered (an ack, or an error with a known code and one line), no traceback
reaches the log, the database stays intact, and the next honest client is served.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch import protocol
from test_ingest import Client, Server, events, run_start, step, shared_dir  # noqa: F401 (fixture)

from gpuwatch.config import Config


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
    cfg = Config(db=str(shared_dir / "gpuwatch.db"), socket=str(shared_dir / "gw.sock"), system=True,
                 rate_limit_events=0)
    srv = Server(cfg)
    yield srv
    srv.close()


# --- what a hostile client sends ------------------------------------------------------------

def _line(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode() + b"\n"


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["", "x" * 5000, "step", "run_start", "r1", "\x00", "\ud800", "é" * 100]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


@st.composite
def event(draw):
    """An event of a real kind whose fields hold anything: right, wrong, huge, null."""
    kind = draw(st.sampled_from(list(protocol.EVENT_KINDS)))
    specs = {**protocol.COMMON_FIELDS, **protocol.EVENT_KINDS[kind]}
    ev = {"id": draw(st.text(min_size=1, max_size=12)), "kind": kind, "run_id": "r1",
          "ts_ms": draw(st.integers(0, 2**64))}
    for name in draw(st.lists(st.sampled_from(list(specs)), max_size=6)):
        ev[name] = draw(values)
    if draw(st.booleans()):
        ev[draw(st.text(max_size=10))] = draw(values)  # an unknown field
    return ev


def _nested(depth: int, leaf="1") -> str:
    return "[" * depth + leaf + "]" * depth


def _as_bytes(value) -> bytes:
    return value if isinstance(value, bytes) else _line(value)


frames = st.one_of(
    st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"") + b"\n"),       # random bytes
    values.map(_line),                                                           # any JSON
    st.fixed_dictionaries({"v": values, "type": values}).map(_line),             # a wrong envelope
    st.lists(event(), min_size=1, max_size=5).map(lambda evs: _line(events(*evs))),
    st.builds(lambda k, v: _line({"v": 1, "type": "events", "events": [dict(step(0), **{k: v})]}),
              st.sampled_from(list({**protocol.COMMON_FIELDS, **protocol.EVENT_KINDS["step"]})), values),
    st.builds(lambda a, r, s: _line({"v": 1, "type": "control_request", "action": a, "run_id": r, "steps": s}),
              values, values, values),
    st.integers(10, 200_000).map(lambda n: f'{{"v":1,"type":"events","events":{_nested(n)}}}\n'.encode()),
    st.integers(25, 40).map(lambda n: ('{"v":1,"type":"events","events":[{"id":"c","kind":"run_start",'
                                       f'"run_id":"r1","ts_ms":1,"config":{{"a":{_nested(n)}}}}}]}}\n').encode()),
    st.integers(1, 5000).map(lambda n: f'{{"v":1,"type":"hello","client":{"9" * n}}}\n'.encode()),  # huge number
    st.sampled_from([b'{"v":1,"type":"hello","client":"\xff\xfe"}\n',           # invalid UTF-8
                     b'{"v":1,"type":"hello","client":"\\udc00"}\n',             # a lone surrogate
                     b'{"v":1,"type":"hello","client":1e999}\n', b'{"v":NaN}\n', b"\n", b" \n",
                     b'{"v":1,"type":"events","events":[{"kind":{"a":1}}]}\n',
                     b'{"v":1,"type":"events","events":[{"kind":[1]}]}\n']),
)


@st.composite
def session(draw):
    """A connection's worth of frames, then maybe half a frame, then a close or a hang-up."""
    hello = draw(st.booleans())
    sent = draw(st.lists(frames, min_size=80, max_size=90))
    tail = draw(st.one_of(st.none(), st.binary(min_size=1, max_size=200).map(lambda b: b.replace(b"\n", b""))))
    ending = draw(st.sampled_from(["read", "read", "hang_up"]))
    return hello, sent, tail or None, ending


def _check_reply(reply: dict) -> None:
    assert reply.get("type") in ("ack", "welcome", "error", "control_result"), reply
    if reply["type"] == "error":
        assert reply["code"] in protocol.ERROR_CODES, reply
        assert reply["code"] != "internal", reply  # our own bug: the fuzz found one
        assert "\n" not in reply["error"] and len(reply["error"]) < 1000, reply


def test_fuzzing_the_socket_answers_every_frame_and_logs_no_traceback(open_server, records):
    srv = open_server
    honest = Client(srv.cfg.socket_path)
    assert honest.rt(events(run_start("r1")))["type"] == "ack"  # a real run the fuzz can hit
    counted = []

    @settings(max_examples=126, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
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
        assert conn.execute("SELECT step FROM steps WHERE run_id = 'r1' AND step IN (0, 1)").fetchall() \
            == [(0,), (1,)]
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
    assert open_server.ingest.uids == {} or all(u.pending_bytes == 0 for u in open_server.ingest.uids.values())
    assert records.tracebacks() == []

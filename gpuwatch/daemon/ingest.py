"""The socket ingest: an asyncio Unix stream server that turns client frames into committed rows.

Identity comes from SO_PEERCRED on each connection, never from a message. Every frame gets
an answer: an ack, or an error with a code (protocol.ERROR_CODES) and one line; an oversized,
truncated or too slow frame also ends that connection (its framing can no longer be trusted).
A client's mistake is logged at most once a minute per (uid, code), with a count of the rest;
a frame our own code fails on is answered `internal` and logged once with its first bytes.
Events are acknowledged only after the writer committed them.

Hostile or greedy clients:
- memory: a connection has one frame in flight and its unfinished frame is capped; a uid's
  unfinished frames together are capped (UID_PENDING_BYTES) and each must arrive within
  FRAME_TIMEOUT_S of its first byte; a client that never reads its replies stops being read.
- fairness: frames are decoded one uid at a time in turn, and each uid has at most
  UID_WRITER_FRAMES frames waiting for the writer, so a flood from one uid delays another
  uid's acks by a few frames, not by the flood.
- connections: RLIMIT_NOFILE is raised to its hard limit; a uid may hold
  MAX_CONNECTIONS_PER_UID connections.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import resource
import socket
import time
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from gpuwatch import protocol
from gpuwatch.base.config import Config
from gpuwatch.base.unix_socket import bind_socket, in_group, peer_credentials, user_name
from gpuwatch.base.version import __version__
from gpuwatch.daemon.logging import Throttle
from gpuwatch.daemon.stalls import dump_row, stepping_pid
from gpuwatch.store import Writer, now_ms
from gpuwatch.store.events import Outcome, Peer, apply_events
from gpuwatch.store.queries import run_owner
from gpuwatch.store.writer import JobRefused, StoreFailed, storage_problem

if TYPE_CHECKING:
    from sqlite3 import Connection as Db

log = logging.getLogger(__name__)
T = TypeVar("T")
Frame = dict[str, Any]  # a frame as protocol.decode gives it, or a reply
Decoded = protocol.Message | protocol.ProtocolError  # what a frame's bytes turn out to be

MAX_INFLIGHT_EVENTS = 50_000
READ_CHUNK = 64 * 1024
FRAME_TIMEOUT_S = 30.0  # a frame's last byte must come this soon after its first
UID_PENDING_BYTES = 4 * protocol.MAX_FRAME_BYTES  # unfinished frames of one uid, all connections
UID_WRITER_FRAMES = 4  # frames of one uid waiting for the writer at once
MAX_CONNECTIONS_PER_UID = 4096
_run_id_of = itemgetter("run_id")
BUSY = protocol.error("daemon busy: write queue full; retry later", "busy")


class _WriterBusy(Exception):
    """The writer's queue is full: the frame is answered BUSY."""


class TokenBucket:
    """`rate` events per second, bursts up to `burst`."""

    def __init__(self, rate: float, burst: float):
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self, n: int) -> float:
        """Take n tokens: 0.0 if allowed, else the seconds until they would be."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= n:
            self.tokens -= n
            return 0.0
        return (n - self.tokens) / self.rate


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (1024 is a common soft default: a thousand
    idle clients would starve accept()); returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class FramingError(Exception):
    """The byte stream cannot be split into frames any more; the reply closes the connection."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


def socket_mode(cfg: Config) -> int:
    if not cfg.system:
        return 0o600
    return 0o660 if cfg.socket_group else 0o666


@dataclass(eq=False)
class Connection:
    peer: Peer
    gid: int
    writer: asyncio.StreamWriter
    greeted: bool = False
    task: asyncio.Task[None] | None = None
    buf: bytearray = field(default_factory=bytearray)  # received, not yet a whole frame
    scanned: int = 0  # bytes of buf known to hold no newline
    held: int = 0  # bytes counted against the uid's UID_PENDING_BYTES
    deadline: float = 0.0  # when the frame being received must be complete

    def send(self, frame: Frame) -> None:
        try:
            data = protocol.encode(frame)
        except protocol.ProtocolError as e:  # a reply over the cap (huge warnings): say so instead
            data = protocol.encode(protocol.error(f"reply not sent: {e}", "internal"))
        self.writer.write(data)


class _Uid:
    """Per-uid state shared by that uid's connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.pending_bytes = 0
        # (line, future of its decoding) to decode, in order
        self.frames: collections.deque[tuple[bytes, asyncio.Future[Decoded]]] = collections.deque()
        self.writer_slots = asyncio.Semaphore(UID_WRITER_FRAMES)


async def _discard_input(reader: asyncio.StreamReader, seconds: float = 2.0) -> None:
    """Read and drop what the peer is still sending, briefly, before closing: closing with
    unread input would reset the connection and destroy the error reply it has not read yet."""
    try:
        await asyncio.wait_for(_drain_reader(reader), seconds)
    except (asyncio.TimeoutError, ConnectionError):
        pass


async def _drain_reader(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


class IngestServer:
    """Serves cfg.socket_path on the running asyncio loop; feeds `writer`."""

    def __init__(self, cfg: Config, writer: Writer, mode: str = "daemon"):
        self.cfg = cfg
        self.writer = writer
        self.mode = mode  # runs.mode of what it records: "embedded" when a client serves its own
        self.path = cfg.socket_path
        self.buckets: dict[int, TokenBucket] = {}
        self.inflight_events = 0
        self.connections: set[Connection] = set()
        self.run_connections: dict[str, Connection] = {}  # run_id -> connection feeding it
        self.uids: dict[int, _Uid] = {}
        self._turns: collections.deque[int] = collections.deque()  # uids with frames to decode
        self._decoder: asyncio.Task[None] | None = None
        self.client_log = Throttle(log)
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None

    async def start(self, sock: socket.socket | None = None) -> None:
        """Serve `sock` if given (bound at self.path and listening already), else bind it."""
        fds = raise_fd_limit()
        if sock is None:
            sock = bind_socket(self.path, socket_mode(self.cfg), self.cfg.socket_group)
        self._inode = os.stat(self.path).st_ino
        # A small StreamReader limit: frames are assembled in Connection.buf under our caps.
        self._server = await asyncio.start_unix_server(self._serve, sock=sock, limit=READ_CHUNK)
        log.info("listening on %s (up to %d open files)", self.path, fds)

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self.connections):
            conn.writer.close()
        # Let each handler see its closed connection and return: a handler still waiting when
        # the loop ends is cancelled, and Python 3.11's stream callback logs that as an error.
        handlers = [conn.task for conn in self.connections if conn.task is not None]
        if handlers:
            await asyncio.wait(handlers, timeout=2.0)
        await self._server.wait_closed()
        self._server = None
        if self._decoder is not None:
            self._decoder.cancel()
        try:  # remove our socket, not one a newer daemon put there
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    # --- the daemon side of the control channel ---

    def push_control(self, run_id: str, action: str, **fields: object) -> bool:
        """Send a control message to the connection feeding `run_id`; False if none is."""
        conn = self.run_connections.get(run_id)
        if conn is None or conn.writer.is_closing():
            return False
        conn.send({"type": "control", "run_id": run_id, "action": action, **fields})
        return True

    # --- one connection ---

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
        conn = Connection(Peer(uid, user_name(uid), pid, self.mode), gid, writer, task=asyncio.current_task())
        state = self.uids.get(uid) or self.uids.setdefault(uid, _Uid())
        state.connections += 1
        self.connections.add(conn)
        try:
            if state.connections > MAX_CONNECTIONS_PER_UID:
                raise FramingError(
                    f"uid {uid} already has {MAX_CONNECTIONS_PER_UID} connections open", "busy"
                )
            while True:
                line = await self._next_frame(conn, reader, state)
                if line is None:
                    break
                reply = await self._answer(conn, state, line)
                self._hold(conn, state, len(conn.buf))  # the frame is answered: its bytes are free
                conn.send(reply)
                await writer.drain()  # a client that never reads its replies stops being read
        except FramingError as e:
            self._refused(conn, e.code, str(e))
            conn.send(protocol.error(str(e), e.code))
            try:
                await writer.drain()
                if e.code == "too_large":
                    await _discard_input(reader)
            except (ConnectionError, BrokenPipeError):
                pass
        except (ConnectionError, BrokenPipeError):
            pass
        except Exception:  # a bug of ours; the client must never take the daemon down
            self.client_log.log(
                ("bug", uid),
                logging.ERROR,
                "ingest: connection from uid %d pid %d failed",
                uid,
                pid,
                exc_info=True,
            )
        finally:
            self.connections.discard(conn)
            self._hold(conn, state, 0)
            state.connections -= 1
            if not state.connections and not state.frames:
                del self.uids[uid]
            for run_id in [r for r, c in self.run_connections.items() if c is conn]:
                del self.run_connections[run_id]
            try:
                await writer.drain()
            except (ConnectionError, BrokenPipeError):
                pass
            writer.close()

    def _hold(self, conn: Connection, state: _Uid, nbytes: int) -> None:
        """Count `nbytes` of this connection against its uid's budget of unfinished frames."""
        state.pending_bytes += nbytes - conn.held
        conn.held = nbytes

    async def _next_frame(self, conn: Connection, reader: asyncio.StreamReader, state: _Uid) -> bytes | None:
        """The next whole frame line, None at a clean end; FramingError when the stream is bad."""
        buf = conn.buf
        loop = asyncio.get_running_loop()
        while True:
            end = buf.find(b"\n", conn.scanned)
            if end >= 0:
                line = bytes(buf[: end + 1])
                del buf[: end + 1]
                conn.scanned = 0
                conn.deadline = loop.time() + FRAME_TIMEOUT_S  # for a next frame already begun
                return line  # its bytes stay held until it is answered
            conn.scanned = len(buf)
            if len(buf) > protocol.MAX_FRAME_BYTES:
                raise FramingError(
                    f"frame exceeds {protocol.MAX_FRAME_BYTES} bytes without a newline; closing", "too_large"
                )
            if not buf:
                chunk = await reader.read(READ_CHUNK)  # between frames a client may idle at will
                conn.deadline = loop.time() + FRAME_TIMEOUT_S
            else:
                try:
                    chunk = await asyncio.wait_for(reader.read(READ_CHUNK), conn.deadline - loop.time())
                except asyncio.TimeoutError:
                    raise FramingError(
                        f"frame not complete {FRAME_TIMEOUT_S:g} s after its first byte; closing", "timeout"
                    ) from None
            if not chunk:
                if buf:
                    raise FramingError("truncated frame: the stream ended before its newline", "truncated")
                return None
            buf += chunk
            self._hold(conn, state, len(buf))
            if state.pending_bytes > UID_PENDING_BYTES:
                raise FramingError(
                    f"uid {conn.peer.uid} has more than {UID_PENDING_BYTES} bytes of "
                    "unfinished frames; closing this connection",
                    "busy",
                )

    def _refused(self, conn: Connection, code: str, message: str) -> None:
        """Log an error reply at most once a minute per (uid, code)."""
        peer = conn.peer
        self.client_log.log(
            (peer.uid, code),
            logging.WARNING,
            "ingest: uid %d (%s) pid %d: %s: %s",
            peer.uid,
            peer.user,
            peer.pid,
            code,
            message,
        )

    async def _answer(self, conn: Connection, state: _Uid, line: bytes) -> Frame:
        """The reply to one frame, whatever its bytes: never raises for a client's input."""
        try:
            msg = await self._decoded(state, conn.peer.uid, line)
            if isinstance(msg, protocol.ProtocolError):
                reply = protocol.error(str(msg), msg.code)
            else:
                reply = await self._handle(conn, msg, line)
        except _WriterBusy:
            reply = BUSY
        except Exception:  # a bug of ours: answered, logged once with the frame's first bytes
            self.client_log.log(
                ("internal", conn.peer.uid),
                logging.ERROR,
                "ingest: failed on a frame from uid %d pid %d, first bytes %r",
                conn.peer.uid,
                conn.peer.pid,
                line[:200],
                exc_info=True,
            )
            reply = protocol.error("the daemon failed on this frame (logged); do not resend it", "internal")
        if reply.get("type") == "error" and reply["code"] != "internal":  # that one is logged already
            self._refused(conn, reply["code"], reply["error"])
        return reply

    async def _decoded(self, state: _Uid, uid: int, line: bytes) -> Decoded:
        """Decode and validate `line` in this uid's turn: uids with frames waiting are served
        round-robin, one frame each, so one uid's flood cannot hold the loop."""
        future: asyncio.Future[Decoded] = asyncio.get_running_loop().create_future()
        if not state.frames:
            self._turns.append(uid)
        state.frames.append((line, future))
        if self._decoder is None or self._decoder.done():
            self._decoder = asyncio.create_task(self._decode_in_turn())
        return await future

    async def _decode_in_turn(self) -> None:
        while self._turns:
            uid = self._turns.popleft()
            state = self.uids.get(uid)
            if state is None or not state.frames:
                continue
            line, future = state.frames.popleft()
            if state.frames:
                self._turns.append(uid)
            if not future.done():
                try:
                    future.set_result(protocol.validate(protocol.decode(line)))
                except protocol.ProtocolError as e:
                    future.set_result(e)
                except Exception as e:  # a bug of ours: _answer logs and answers it
                    future.set_exception(e)
            await asyncio.sleep(0)  # let replies go out and other frames arrive

    async def _handle(self, conn: Connection, msg: protocol.Message, line: bytes) -> Frame:
        if msg.type == "hello":
            conn.greeted = True
            return {
                "type": "welcome",
                "uid": conn.peer.uid,
                "pid": conn.peer.pid,
                "server": f"gpuwatch/{__version__}",
            }
        if not conn.greeted:
            return protocol.error(f"send hello before {msg.type}", "handshake")
        if msg.type == "events":
            async with self.uids[conn.peer.uid].writer_slots:
                return await self._events(conn, msg, line)
        if msg.type == "wish":
            return await self._wish(conn, msg.frame)
        return await self._control_request(conn, msg.frame)

    async def _wish(self, conn: Connection, frame: Frame) -> Frame:
        """Store a when-free wish owned by the peer's uid (SO_PEERCRED, never the message)."""
        from gpuwatch.alerts.host_rules import add_wish

        peer, host = conn.peer, socket.gethostname()
        try:
            wish_id = await self._on_writer(
                lambda db: add_wish(
                    db,
                    peer.uid,
                    peer.user,
                    host,
                    now_ms(),
                    frame["gpus"],
                    frame["min_free_bytes"],
                    frame["max_util_pct"],
                    frame["window_min"],
                )
            )
        except Exception:  # rolled back (and a job's own error logged) by the writer
            return protocol.error("database write failed; try again", "store")
        log.info("when-free wish %d stored for uid %d", wish_id, peer.uid)
        return {"type": "wish_added", "id": wish_id, "host": host}

    async def _events(self, conn: Connection, msg: protocol.Message, line: bytes) -> Frame:
        n = len(msg.events)
        if self.cfg.rate_limit_events > 0:
            rate = self.cfg.rate_limit_events
            bucket = self.buckets.setdefault(
                conn.peer.uid, TokenBucket(rate, max(rate, protocol.MAX_EVENTS_PER_BATCH))
            )
            wait_s = bucket.take(n)
            if wait_s:
                return protocol.error(
                    "rate limit exceeded", "rate_limited", retry_after_ms=int(wait_s * 1000) + 1
                )
        if self.inflight_events + n > MAX_INFLIGHT_EVENTS:
            return BUSY

        def job(db: Db) -> Outcome:
            try:
                return apply_events(db, msg.events, conn.peer)
            except Exception as e:
                if storage_problem(e):
                    raise  # the disk's fault: `store`, and the client retries
                raise JobRefused from e  # ours: rolled back, answered `internal`, never retried

        self.inflight_events += n
        try:
            outcome = await self._on_writer(job)
        except JobRefused as refused:
            e = refused.__cause__
            assert e is not None  # job() sets it
            self.client_log.log(
                ("internal", conn.peer.uid),
                logging.ERROR,
                "ingest: storing a frame from uid %d pid %d failed, first bytes %r",
                conn.peer.uid,
                conn.peer.pid,
                line[:200],
                exc_info=(type(e), e, e.__traceback__),
            )
            return protocol.error(
                f"the daemon failed to store this frame ({type(e).__name__}, logged); do not resend it",
                "internal",
            )
        except StoreFailed:
            health = self.writer.health
            why = f" ({health.problem})" if health is not None else ""
            return protocol.error(f"database write failed{why}; keep the events and retry later", "store")
        finally:
            self.inflight_events -= n
        if outcome.rejected:
            applied = set(outcome.applied)
            run_ids = {e["run_id"] for e in msg.events if e["id"] in applied}
        else:
            run_ids = set(map(_run_id_of, msg.events))
        for run_id in run_ids:
            self.run_connections[run_id] = conn  # where control for this run goes
        return outcome.reply(msg.warnings)

    async def _control_request(self, conn: Connection, frame: Frame) -> Frame:
        run_id, action = frame["run_id"], frame["action"]
        try:
            owner = await self._on_writer(lambda db: run_owner(db, run_id))
        except StoreFailed as e:
            return protocol.error(f"{e}; try again", "store")
        if owner is None:
            return protocol.error(f"no run {run_id!r}", "unknown_run")
        peer = conn.peer
        if not (peer.uid in (0, owner) or in_group(peer.uid, conn.gid, self.cfg.admin_group)):
            return protocol.error(
                f"uid {peer.uid} may not control run {run_id!r} (owner uid {owner}; "
                f"root and group {self.cfg.admin_group!r} may)",
                "forbidden",
            )
        if action == "stacks":
            return await self._stacks(run_id)
        fields = {k: frame[k] for k in protocol.CONTROL_ACTIONS[action] if frame.get(k) is not None}
        if not self.push_control(run_id, action, **fields):
            return protocol.error(
                f"run {run_id!r} has no client connected to this daemon "
                f"(finished, or running in embedded mode)",
                "not_connected",
            )
        log.info("control %s for run %s sent on behalf of uid %d", action, run_id, peer.uid)
        return {"type": "control_result", "run_id": run_id, "action": action, "delivered": True}

    async def _stacks(self, run_id: str) -> Frame:
        """Dump the run's stacks from here (the daemon holds CAP_SYS_PTRACE), store and return them."""
        try:
            pid = await self._on_writer(lambda db: stepping_pid(db, run_id))
        except StoreFailed as e:
            return protocol.error(f"{e}; try again", "store")
        if pid is None:
            return protocol.error(f"run {run_id!r} has no process id", "unknown_run")
        row = await asyncio.to_thread(dump_row, run_id, pid, "on_demand")
        if self.writer.insert("stack_dumps", [row], block=False) is None:
            log.warning("stacks of run %s not stored: write queue full", run_id)
        reply = {
            "type": "control_result",
            "run_id": run_id,
            "action": "stacks",
            "delivered": True,
            **{k: row[k] for k in ("pid", "ts_ms", "stacks_json", "error")},
        }
        if len(row["stacks_json"] or "") > protocol.MAX_FRAME_BYTES // 2:
            reply.update(stacks_json=None, error="stacks stored but too large to send; see the database")
        return reply

    async def _on_writer(self, job: Callable[[Db], T]) -> T:
        """Run `job` on the writer thread; its value once committed, or the writer's exception
        (Writer.submit). _WriterBusy if the writer's queue is full: the loop serves everyone,
        it never waits for room."""
        future = self.writer.submit(job, block=False)
        if future is None:
            raise _WriterBusy
        return await asyncio.wrap_future(future)

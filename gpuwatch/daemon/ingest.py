"""The socket ingest: an asyncio Unix stream server that turns client frames into committed rows.

Identity comes from SO_PEERCRED on each connection, never from a message. Every bad frame
gets an error reply and the server keeps serving; an oversized or truncated frame also ends
that connection (its framing can no longer be trusted). Events are acknowledged only after
the writer committed them. Memory is bounded: at most MAX_INFLIGHT_EVENTS wait for the
writer, each connection has one frame in flight, and frames are capped in size.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import pwd
import socket
import struct
import tempfile
import time
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

from gpuwatch import __version__, protocol
from gpuwatch.config import Config
from gpuwatch.daemon.stalls import dump_row, stepping_pid
from gpuwatch.store import Writer
from gpuwatch.store.events import Outcome, Peer, apply_events

log = logging.getLogger(__name__)

MAX_INFLIGHT_EVENTS = 50_000
_run_id_of = itemgetter("run_id")
BUSY = protocol.error("daemon busy: write queue full; retry later", "busy")


class IngestError(OSError):
    """The server cannot start (socket taken or unusable); one line saying why."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def in_group(uid: int, gid: int, group: str) -> bool:
    """True if the user `uid` (primary group `gid`) is a member of `group`."""
    if not group:
        return False
    try:
        group_gid = grp.getgrnam(group).gr_gid
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    return group_gid in os.getgrouplist(name, gid)


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


def bind_socket(path: Path, mode: int, group: str = "") -> socket.socket:
    """Listen at `path` with `mode` from the first instant: bind in a private directory, set
    mode and group there, then rename into place (no bind->chmod window, no umask games)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if mode & 0o077 else 0o700)
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # stale: nothing answers
        except OSError as e:
            raise IngestError(f"{path} exists and cannot be probed: {e.strerror}") from None
        else:
            raise IngestError(f"another daemon is already listening on {path}")
        finally:
            probe.close()
    private = tempfile.mkdtemp(prefix=".bind-", dir=path.parent)
    tmp = os.path.join(private, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(tmp)
        os.chmod(tmp, mode)
        if group:
            try:
                os.chown(tmp, -1, grp.getgrnam(group).gr_gid)
            except KeyError:
                raise IngestError(f"socket_group {group!r} does not exist") from None
        sock.listen(128)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.rmdir(private)
    return sock


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
    task: asyncio.Task | None = None

    def send(self, frame: dict) -> None:
        self.writer.write(protocol.encode(frame))


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

    def __init__(self, cfg: Config, writer: Writer):
        self.cfg = cfg
        self.writer = writer
        self.path = cfg.socket_path
        self.buckets: dict[int, TokenBucket] = {}
        self.inflight_events = 0
        self.connections: set[Connection] = set()
        self.run_connections: dict[str, Connection] = {}  # run_id -> connection feeding it
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None

    async def start(self) -> None:
        sock = bind_socket(self.path, socket_mode(self.cfg), self.cfg.socket_group)
        self._inode = os.stat(self.path).st_ino
        self._server = await asyncio.start_unix_server(
            self._serve, sock=sock, limit=protocol.MAX_FRAME_BYTES)
        log.info("listening on %s", self.path)

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
        try:  # remove our socket, not one a newer daemon put there
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    # --- the daemon side of the control channel ---

    def push_control(self, run_id: str, action: str, **fields) -> bool:
        """Send a control message to the connection feeding `run_id`; False if none is."""
        conn = self.run_connections.get(run_id)
        if conn is None or conn.writer.is_closing():
            return False
        conn.send({"type": "control", "run_id": run_id, "action": action, **fields})
        return True

    # --- one connection ---

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid, uid, gid = peer_credentials(writer.get_extra_info("socket"))
        conn = Connection(Peer(uid, user_name(uid), pid, "daemon"), gid, writer,
                          task=asyncio.current_task())
        self.connections.add(conn)
        try:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:
                    conn.send(protocol.error(f"frame exceeds {protocol.MAX_FRAME_BYTES} bytes "
                                             f"without a newline; closing", "too_large"))
                    await writer.drain()
                    await _discard_input(reader)
                    break
                if not line:
                    break
                if not line.endswith(b"\n"):
                    conn.send(protocol.error("truncated frame: the stream ended before its newline",
                                             "truncated"))
                    break
                reply = await self._handle(conn, line)
                conn.send(reply)
                await writer.drain()
        except (ConnectionError, BrokenPipeError):
            pass
        except Exception:  # a client must never take the daemon down
            log.exception("ingest: connection from uid %d pid %d failed", uid, pid)
        finally:
            self.connections.discard(conn)
            for run_id in [r for r, c in self.run_connections.items() if c is conn]:
                del self.run_connections[run_id]
            try:
                await writer.drain()
            except (ConnectionError, BrokenPipeError):
                pass
            writer.close()

    async def _handle(self, conn: Connection, line: bytes) -> dict:
        try:
            msg = protocol.validate(protocol.decode(line))
        except protocol.ProtocolError as e:
            code = "version" if str(e).startswith("unsupported protocol version") else "invalid"
            return protocol.error(str(e), code)
        if msg.type == "hello":
            conn.greeted = True
            return {"type": "welcome", "uid": conn.peer.uid, "pid": conn.peer.pid,
                    "server": f"gpuwatch/{__version__}"}
        if not conn.greeted:
            return protocol.error(f"send hello before {msg.type}", "handshake")
        if msg.type == "events":
            return await self._events(conn, msg)
        return await self._control_request(conn, msg.frame)

    async def _events(self, conn: Connection, msg: protocol.Message) -> dict:
        n = len(msg.events)
        if self.cfg.rate_limit_events > 0:
            rate = self.cfg.rate_limit_events
            bucket = self.buckets.setdefault(
                conn.peer.uid, TokenBucket(rate, max(rate, protocol.MAX_EVENTS_PER_BATCH)))
            wait_s = bucket.take(n)
            if wait_s:
                return protocol.error("rate limit exceeded", "rate_limited",
                                      retry_after_ms=int(wait_s * 1000) + 1)
        if self.inflight_events + n > MAX_INFLIGHT_EVENTS:
            return BUSY
        result: list[Outcome] = []
        self.inflight_events += n
        try:
            ok = await self._on_writer(lambda db: result.append(apply_events(db, msg.events, conn.peer)))
        finally:
            self.inflight_events -= n
        if ok is None:
            return BUSY
        if not ok or not result:
            return protocol.error("database write failed; retry later", "store")
        outcome = result[0]
        if outcome.rejected:
            applied = set(outcome.applied)
            run_ids = {e["run_id"] for e in msg.events if e["id"] in applied}
        else:
            run_ids = set(map(_run_id_of, msg.events))
        for run_id in run_ids:
            self.run_connections[run_id] = conn  # where control for this run goes
        return outcome.reply(msg.warnings)

    async def _control_request(self, conn: Connection, frame: dict) -> dict:
        run_id, action = frame["run_id"], frame["action"]
        found: list = []
        ok = await self._on_writer(lambda db: found.extend(
            db.execute("SELECT uid FROM runs WHERE run_id = ?", (run_id,)).fetchall()))
        if ok is None:
            return BUSY
        owner = found[0][0] if found else None
        if owner is None:
            return protocol.error(f"no run {run_id!r}", "unknown_run")
        peer = conn.peer
        if not (peer.uid in (0, owner) or in_group(peer.uid, conn.gid, self.cfg.admin_group)):
            return protocol.error(f"uid {peer.uid} may not control run {run_id!r} (owner uid {owner}; "
                                  f"root and group {self.cfg.admin_group!r} may)", "forbidden")
        if action == "stacks":
            return await self._stacks(run_id)
        fields = {k: frame[k] for k in protocol.CONTROL_ACTIONS[action] if frame.get(k) is not None}
        if not self.push_control(run_id, action, **fields):
            return protocol.error(f"run {run_id!r} has no client connected to this daemon "
                                  f"(finished, or running in embedded mode)", "not_connected")
        log.info("control %s for run %s sent on behalf of uid %d", action, run_id, peer.uid)
        return {"type": "control_result", "run_id": run_id, "action": action, "delivered": True}

    async def _stacks(self, run_id: str) -> dict:
        """Dump the run's stacks from here (the daemon holds CAP_SYS_PTRACE), store and return them."""
        pids: list = []
        if await self._on_writer(lambda db: pids.append(stepping_pid(db, run_id))) is None:
            return BUSY
        if not pids or pids[0] is None:
            return protocol.error(f"run {run_id!r} has no process id", "unknown_run")
        row = await asyncio.to_thread(dump_row, run_id, pids[0], "on_demand")
        if not self.writer.insert("stack_dumps", [row], block=False):
            log.warning("stacks of run %s not stored: write queue full", run_id)
        reply = {"type": "control_result", "run_id": run_id, "action": "stacks", "delivered": True,
                 **{k: row[k] for k in ("pid", "ts_ms", "stacks_json", "error")}}
        if len(row["stacks_json"] or "") > protocol.MAX_FRAME_BYTES // 2:
            reply.update(stacks_json=None, error="stacks stored but too large to send; see the database")
        return reply

    async def _on_writer(self, job) -> bool | None:
        """Run `job` on the writer thread; True once committed, False if it failed, None if the
        writer's queue is full (never waits for room: the loop serves everyone)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def committed(ok: bool) -> None:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(ok))

        if not self.writer.submit(job, committed, block=False):
            return None
        return await done

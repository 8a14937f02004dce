"""How a workload's events reach the database: through the daemon's socket, or embedded.

`connect(cfg)` returns a DaemonTransport when a daemon answers on its socket, else an
EmbeddedTransport that writes the same schema to the per-user database with the same rules
(gpuwatch.store.events) and samples GPUs/host in a background thread.

DaemonTransport never blocks the caller: `send()` puts the event on a bounded queue and a
sender thread batches, sends and waits for acks (sent only after the daemon committed). Steps
come folded (client/fold.py), so the queue fills only if the daemon stops answering; then the
event is DROPPED and counted in `dropped` (never a wait: the training loop matters more). An
urgent event (a run's end) goes ahead of everything queued, and `close(timeout)` returns in
that time: what is still queued then goes to the spool. When the daemon is away, the connection breaks, or the
daemon says "rate limited"/"busy", unacknowledged events go to a spool file
(<spool dir>/<pid>-<token>.jsonl, see gpuwatch/base/spool.py); the sender reconnects with backoff,
replays the spool in order, then deletes it. Acked ids are never resent; anything resent
after a lost ack is deduplicated by the database's natural keys. A spool left by a process
that died (or ended while the daemon was away) is replayed by the daemon when it is back, or
by the next client of the same user that reaches the daemon and can list the directory.
"""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import json
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from gpuwatch import protocol
from gpuwatch.base import paths, spool, threads
from gpuwatch.base.config import Config
from gpuwatch.base.diskfull import FullDisk, no_space
from gpuwatch.client.attach import ENV_RUN_ID
from gpuwatch.client.link import Link as _Link
from gpuwatch.client.link import TransportClosed, socket_candidates

if TYPE_CHECKING:
    import sqlite3

    from gpuwatch.monitor.sampler import Sampler
    from gpuwatch.store.events import Outcome

log = logging.getLogger(__name__)

# Embedded mode: events waiting for the writer; past this (a stuck disk) they are dropped and
# counted rather than growing the training process without bound.
PENDING_MAX = 100_000
# A spool is replayed this many bytes at a time: the client's memory stays bounded however long
# the daemon was away.
REPLAY_CHUNK_BYTES = 1 << 20
EMBEDDED_LINGER_S = 0.1
# The sender gathers events this long before it encodes and sends them (not when someone waits:
# an urgent event, flush(), close()): a run's steps come a drain at a time (see run.py's
# DRAIN_EVERY_MS), so a frame holds a drain's.
SEND_LINGER_S = 0.05


# One encoder for every event (json.dumps with separators= builds a new one each call).
_encode = json.JSONEncoder(separators=(",", ":")).encode
_WAKE = object()  # put on the queue to wake the sender: for an urgent event, or close()


class Transport(abc.ABC):
    """What gpuwatch.client uses; see the module docstring."""

    mode: str = ""
    control_handler: Callable[[dict[str, Any]], None] | None = None
    dropped = 0  # events lost because the queue was full
    rejected = 0  # events the protocol or the daemon refused (bugs, other users' runs)

    @abc.abstractmethod
    def send(self, event: dict[str, Any], urgent: bool = False) -> None:
        """Queue one event; never blocks the caller. Urgent: ahead of everything queued."""

    @abc.abstractmethod
    def send_many(self, events: list[dict[str, Any]]) -> None:
        """Queue several events in order, as send() each would (a drain's steps: one lock, not
        one per event)."""

    @abc.abstractmethod
    def request(self, msg: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """One synchronous request and its reply."""

    @abc.abstractmethod
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event sent so far is committed (or spooled); False on timeout."""

    @abc.abstractmethod
    def close(self, timeout: float = 30.0) -> None:
        """Flush (for at most `timeout` seconds), then stop the background threads."""

    def _reject(self, n: int, why: str) -> None:
        if not self.rejected:
            log.warning("gpuwatch: events refused: %s", why)
        self.rejected += n


def _daemon_link(cfg: Config) -> tuple[Path, _Link] | None:
    for path in socket_candidates(cfg):
        try:
            return path, _Link.open(path, timeout=2.0)
        except (OSError, TransportClosed, protocol.ProtocolError):
            continue
    return None


def daemon_answers(cfg: Config) -> bool:
    """True when a daemon (or a `gpuwatch run` serving its child) answers on a socket of cfg's."""
    found = _daemon_link(cfg)
    if found is not None:
        found[1].close()
    return found is not None


def connect(cfg: Config, **options: Any) -> Transport:
    found = _daemon_link(cfg)
    if found is not None:
        return DaemonTransport(cfg, *found, **options)
    return EmbeddedTransport(cfg)


def _frames(encoded: list[bytes]) -> list[list[int]]:
    """Split event indexes into frames under the event-count and byte caps."""
    groups: list[list[int]] = []
    size = protocol.MAX_FRAME_BYTES  # forces a new group first
    for i, data in enumerate(encoded):
        if (
            size + len(data) + 1 > protocol.MAX_FRAME_BYTES - 64
            or len(groups[-1]) >= protocol.MAX_EVENTS_PER_BATCH
        ):
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += len(data) + 1
    return groups


def _events_frame(parts: list[bytes]) -> bytes:
    return b'{"v":%d,"type":"events","events":[%s]}\n' % (protocol.VERSION, b",".join(parts))


class DaemonTransport(Transport):
    mode = "daemon"

    def __init__(
        self,
        cfg: Config,
        path: Path,
        link: _Link | None = None,
        *,
        queue_size: int = 10_000,
        max_backoff: float = 5.0,
        ack_timeout: float = 30.0,
        spool_dir: Path | None = None,
    ):
        self.cfg = cfg
        self.path = path
        self.max_backoff = max_backoff
        self.ack_timeout = ack_timeout
        self.spool_dir, self.spool_mode = spool_dir_for(cfg, path, spool_dir)
        self._spool_full = FullDisk(log, "gpuwatch: spool")
        self.spool_path = self.spool_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}{spool.SUFFIX}"
        self._link = link
        self._queue: queue.Queue[dict[str, Any] | list[dict[str, Any]] | object] = queue.Queue(
            maxsize=queue_size
        )
        self._urgent: collections.deque[dict[str, Any]] = collections.deque()  # taken before the queue
        self._backoff = 0.0
        self._retry_at = 0.0
        self._enqueued = 0
        self._finished = 0
        self._progress = threading.Condition()
        self._closing = False
        self._hurry = False  # closing and out of time: spool what is left instead of sending
        # Set by an urgent event, flush() or close(): someone waits, so the sender stops
        # gathering a burst.
        self._waited_for = threading.Event()
        self._thread = threads.start(threading.Thread(target=self._run, name="gpuwatch-sender", daemon=True))

    # --- caller side ---

    def send(self, event: dict[str, Any], urgent: bool = False) -> None:
        with self._progress:
            if self._closing:
                return
            if urgent:
                self._urgent.append(event)
                self._enqueued += 1
                self._waited_for.set()
                try:
                    self._queue.put_nowait(_WAKE)  # a full queue: the sender is awake anyway
                except queue.Full:
                    pass
                return
            try:
                self._queue.put_nowait(event)
            except queue.Full:
                if not self.dropped:
                    log.warning("gpuwatch: event queue full; dropping events (counted in dropped)")
                self.dropped += 1
                return
            self._enqueued += 1

    def send_many(self, events: list[dict[str, Any]]) -> None:
        # One item of the queue (its size counts sends, not events): a lock and a wake-up of the
        # sender a drain, not one an event.
        with self._progress:
            if self._closing or not events:
                return
            try:
                self._queue.put_nowait(list(events))
            except queue.Full:
                if not self.dropped:
                    log.warning("gpuwatch: event queue full; dropping events (counted in dropped)")
                self.dropped += len(events)
                return
            self._enqueued += len(events)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything sent so far is acknowledged by the daemon or spooled."""
        self._waited_for.set()
        with self._progress:
            target = self._enqueued
            return self._progress.wait_for(lambda: self._finished >= target, timeout)

    def close(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        if not self.flush(timeout):
            self._hurry = True  # out of time: the sender spools the rest for the daemon to replay
        with self._progress:
            self._closing = True
        try:
            self._queue.put_nowait(_WAKE)  # the sender stops now, not at its next poll
        except queue.Full:
            pass
        # A sender stuck in a send to a daemon that stopped reading gives up at ack_timeout; we
        # do not wait for it (its thread is a daemon thread) beyond a short grace.
        self._thread.join(max(0.2, deadline - time.monotonic()))
        if self._spool_exists():
            log.warning("gpuwatch: daemon unreachable; events kept in %s for replay", self.spool_path)

    def request(self, msg: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """One frame on a connection of its own; returns the daemon's reply. If the daemon
        cannot take an events frame now, its events are queued (spooled) like send()."""
        try:
            link = _Link.open(self.path, timeout)
            try:
                link.sock.sendall(protocol.encode(msg))
                reply = link.read_frame(timeout)
            finally:
                link.close()
        except (OSError, TransportClosed, protocol.ProtocolError) as e:
            reply = protocol.error(f"daemon unavailable: {e}", "unavailable")
        if msg.get("type") == "events" and reply.get("code") in protocol.RETRYABLE_CODES:
            acked = set(reply.get("ids", ()))
            for event in msg.get("events", ()):
                if event.get("id") not in acked:
                    self.send(event)
            reply["queued"] = True
        return reply

    # --- the sender thread ---

    def _run(self) -> None:
        if self._link is not None:
            self._adopt_orphan_spools()
        while True:
            batch = self._collect()
            if batch:
                try:
                    self._dispatch(batch)
                except OSError as e:  # e.g. the spool's disk is full: lose these, keep going
                    log.error("gpuwatch: %d events lost: %s", len(batch), e)
                    self.dropped += len(batch)
                with self._progress:
                    self._finished += len(batch)
                    self._progress.notify_all()
            elif self._closing:
                break
            if self._spool_exists() and not self._hurry and self._ready():
                self._replay(self.spool_path)
            elif self._link is not None and not batch:
                self._poll_control()
        if self._spool_exists() and not self._hurry and (self._link is not None or self._reconnect()):
            self._replay(self.spool_path)  # one last try before the process goes
        if self._link is not None:
            self._link.close()

    def _collect(self) -> list[dict[str, Any]]:
        queued: list[Any] = []  # events, lists of them, and _WAKE
        if not self._urgent:
            try:
                queued.append(self._queue.get(timeout=0.2))
            except queue.Empty:
                return []
            # Let a burst gather before encoding it: one wake-up (and one GIL grab in the
            # training process) per burst rather than per step; not when woken, nor while
            # someone waits (a program's exit waits for its run's end).
            if queued[0] is not _WAKE:
                self._waited_for.wait(SEND_LINGER_S)
        while len(queued) < protocol.MAX_EVENTS_PER_BATCH:
            try:
                queued.append(self._queue.get_nowait())
            except queue.Empty:
                break
        # (send_many's lists, flattened)
        queued = [
            event
            for item in queued
            if item is not _WAKE
            for event in (item if type(item) is list else (item,))
        ]
        urgent = self._take_urgent()
        if not urgent:
            return queued
        # The end goes ahead of the queued steps, never ahead of its run's start (or another
        # event queued before it): the daemon refuses an end for a run it does not know yet.
        steps = [event for event in queued if event.get("kind") == "step"]
        return [event for event in queued if event.get("kind") != "step"] + urgent + steps

    def _take_urgent(self) -> list[dict[str, Any]]:
        self._waited_for.clear()  # before taking: an urgent event sent from now on sets it again
        taken = []
        while self._urgent:
            taken.append(self._urgent.popleft())
        return taken

    def _dispatch(self, batch: list[dict[str, Any]]) -> None:
        encoded = []
        # Not checked here: the daemon checks every frame, and a frame it calls invalid is sent
        # again an event at a time (see _deliver), so a bad event costs only itself. (Checking
        # here too cost as much CPU of the training process as its hooks, for every step.)
        for event in batch:
            try:
                data = _encode(event).encode()
            except (TypeError, ValueError) as e:  # a value JSON cannot hold
                self._reject(1, str(e))
                continue
            if len(data) > protocol.MAX_FRAME_BYTES - 64:
                self._reject(1, f"event {event.get('id')!r} of {len(data)} bytes exceeds the frame cap")
                continue
            encoded.append(data)
        if not encoded:
            return
        if not self._hurry and not self._spool_exists() and self._ready():
            encoded = self._deliver(encoded)
        if encoded:
            self._spool(encoded)

    def _ready(self) -> bool:
        """Connected, or reconnected now, and not told to wait."""
        if time.monotonic() < self._retry_at:
            return False
        return self._link is not None or self._reconnect()

    def _reconnect(self) -> bool:
        try:
            self._link = _Link.open(self.path, timeout=2.0)
        except (OSError, TransportClosed, protocol.ProtocolError):
            self._wait_longer()
            return False
        self._backoff = 0.0
        log.info("gpuwatch: connected to the daemon at %s", self.path)
        self._adopt_orphan_spools()
        return True

    def _wait_longer(self, at_least: float = 0.0) -> None:
        self._backoff = min(self.max_backoff, max(0.1, self._backoff * 2, at_least))
        self._retry_at = time.monotonic() + self._backoff

    def _disconnect(self, why: str) -> None:
        log.info("gpuwatch: lost the daemon (%s); spooling", why)
        if self._link is not None:
            self._link.close()
            self._link = None
        self._wait_longer()

    def _deliver(self, encoded: list[bytes]) -> list[bytes]:
        """Send events in capped frames; return those still to be delivered later (in order)."""
        for n, group in enumerate(_frames(encoded)):
            parts = [encoded[i] for i in group]
            try:
                self._live_link().sock.sendall(_events_frame(parts))
                reply = self._reply()
            except (OSError, TransportClosed, protocol.ProtocolError) as e:
                self._disconnect(str(e))
                return encoded[group[0] :]
            if reply.get("type") == "ack":
                continue
            acked = set(reply.get("ids", ()))
            left = [p for p in parts if json.loads(p)["id"] not in acked]
            if reply.get("code") in protocol.RETRYABLE_CODES:
                self._wait_longer(reply.get("retry_after_ms", 0) / 1000)
                return left + encoded[group[-1] + 1 :]
            if reply.get("code") == "invalid" and len(left) > 1:
                # One event an older daemon does not understand: send one by one, lose only it.
                for i, part in enumerate(left):
                    if self._deliver([part]):
                        return left[i:] + encoded[group[-1] + 1 :]
                continue
            self._reject(len(left), reply.get("error", str(reply)))
        return []

    def _live_link(self) -> _Link:
        if self._link is None:
            raise TransportClosed("not connected")
        return self._link

    def _reply(self) -> dict[str, Any]:
        """The reply to the frame just sent; pushed control frames on the way are handled."""
        while True:
            frame = self._live_link().read_frame(self.ack_timeout)
            if frame.get("type") != "control":
                return frame
            self._on_control(frame)

    def _poll_control(self) -> None:
        try:
            link = self._live_link()
            while link.pending():
                frame = link.read_frame(self.ack_timeout)
                if frame.get("type") == "control":
                    self._on_control(frame)
        except (OSError, TransportClosed, protocol.ProtocolError) as e:
            self._disconnect(str(e))

    def _on_control(self, frame: dict[str, Any]) -> None:
        handler = self.control_handler
        if handler is None:
            log.info("gpuwatch: control %s ignored (no handler)", frame.get("action"))
            return
        try:
            handler(frame)
        except Exception:
            log.exception("gpuwatch: control handler failed")

    # --- the spool ---

    def _spool_exists(self) -> bool:
        return self.spool_path.exists()

    def _spool(self, encoded: list[bytes]) -> None:
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(
                self.spool_path,
                os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                self.spool_mode,
            )
            with open(fd, "ab") as f:
                os.fchmod(fd, self.spool_mode)  # whatever the umask: a system daemon must read it
                f.write(b"".join(data + b"\n" for data in encoded))
        except OSError as e:
            if not no_space(e):
                raise
            self._spool_full.failed(
                self.spool_path, e, "events the daemon cannot take are dropped (counted) until it has room"
            )
            self.dropped += len(encoded)
            return
        self._spool_full.ok(self.spool_path)

    def _replay(self, path: Path) -> bool:
        """Send a spool file's events in order, REPLAY_CHUNK_BYTES at a time; delete it when all
        are delivered, else keep what is left of it."""
        sent = 0
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return True
        with f:
            while True:
                encoded = [line.rstrip(b"\n") for line in f.readlines(REPLAY_CHUNK_BYTES) if line.strip()]
                if not encoded:
                    break
                left = self._deliver(encoded)
                if left:
                    self._keep_rest(path, left, f)
                    return False
                sent += len(encoded)
        path.unlink()
        log.info("gpuwatch: replayed %d spooled events from %s", sent, path)
        return True

    def _keep_rest(self, path: Path, left: list[bytes], rest: IO[bytes]) -> None:
        """Rewrite the spool as the undelivered events of this chunk and the file's rest."""
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as out:
                out.write(b"".join(data + b"\n" for data in left))
                shutil.copyfileobj(rest, out)
            os.chmod(tmp, self.spool_mode)
            os.replace(tmp, path)
        except OSError as e:  # no room to rewrite it: the whole file stays (replays are idempotent)
            tmp.unlink(missing_ok=True)
            if not no_space(e):
                raise
            self._spool_full.failed(tmp, e, "the spool is kept whole and replayed again later")

    def _adopt_orphan_spools(self) -> None:
        """Replay spools whose writing process has died (same user: same spool directory)."""
        try:
            names = os.listdir(self.spool_dir)
        except OSError:  # none yet, or a system spool this user may not list: the daemon adopts
            return
        for name in sorted(names):
            pid = spool.writer_pid(name)
            if pid is None or spool.pid_alive(pid):
                continue
            try:
                if os.stat(self.spool_dir / name, follow_symlinks=False).st_uid != os.getuid():
                    continue  # another user's: only the daemon replays it, as that user
            except FileNotFoundError:
                continue
            mine = self.spool_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}{spool.SUFFIX}"
            try:
                os.rename(self.spool_dir / name, mine)  # atomic: one adopter wins
            except FileNotFoundError:
                continue
            if not self._replay(mine):
                return  # left under our pid; the next adopter after us takes it


def spool_dir_for(cfg: Config, path: Path, chosen: Path | None = None) -> tuple[Path, int]:
    """The spool directory for events to the daemon at `path`, and the mode of its files: the
    system spool (which that daemon reads) when talking to the system daemon and it exists,
    else this user's own."""
    system_dir = paths.spool_dir(True)
    if chosen is not None or cfg.spool_dir:
        directory = chosen or Path(cfg.spool_dir)
    elif path == paths.default_socket_path(True) and os.access(system_dir, os.W_OK | os.X_OK):
        directory = system_dir
    else:
        directory = paths.spool_dir(False)
    return directory, spool.file_mode(directory)


class EmbeddedTransport(Transport):
    """No daemon: the same rules into the per-user database, plus the sampler in a thread."""

    mode = "embedded"

    def __init__(self, cfg: Config, sample_now: bool = True):
        """`sample_now`: start the sampler (and the lost-run check) at once; else at
        start_sampler()."""
        import pwd

        from gpuwatch.store import Writer
        from gpuwatch.store.events import Peer

        uid = os.getuid()
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
        self.cfg = cfg
        self.peer = Peer(uid, user, os.getpid(), "embedded")
        self._pending: list[dict[str, Any]] = []
        self._pending_lock = threading.Lock()
        # The writer runs in the training process here: waking it at most ten times a second
        # keeps it from taking the GIL while the loop's torch ops want it back.
        self.writer = Writer(cfg.db_path, linger_s=EMBEDDED_LINGER_S)
        self.sampler: Sampler | None = None
        # The sampler's set-up (NVML, psutil) and the lost-run check happen on a thread of their
        # own: `gpuwatch run` spawns its program meanwhile instead of after them.
        self._starting = threading.Thread(
            target=self._start_sampler, name="gpuwatch-sampler-start", daemon=True
        )
        if sample_now:
            threads.start(self._starting)

    def start_sampler(self) -> None:
        """Start what sample_now=False held back: `gpuwatch run` does once its threads yield the
        CPU to its program, so the sampler's set-up does not slow the program's start."""
        threads.start(self._starting)

    def _start_sampler(self) -> None:
        from gpuwatch.monitor.runs_watch import RunsWatch
        from gpuwatch.monitor.sampler import Sampler

        # No daemon watches this database: runs left `running` by processes that died are
        # marked lost (or killed by the OOM killer) now.
        self.writer.submit(RunsWatch(self.writer).check, block=False)
        # Under `gpuwatch run` (its run id in our environment) the wrapper already samples this
        # host into the same database: a second sampler would double the rows and the warnings.
        if os.environ.get(ENV_RUN_ID):
            return
        try:
            sampler = Sampler(self.writer, self.cfg)
            sampler.start()
        except Exception:  # the events are still recorded, without samples
            log.warning("gpuwatch: the GPU/host sampler could not start", exc_info=True)
            return
        self.sampler = sampler

    def send(self, event: dict[str, Any], urgent: bool = False) -> None:
        # The writer applies what is pending in order, in one transaction: an urgent event needs
        # no lane of its own.
        self.send_many([event])

    def send_many(self, events: list[dict[str, Any]]) -> None:
        # One writer job per burst of events, not one per event: the writer applies whatever
        # piled up in one transaction, taking the GIL from the training loop once per burst.
        with self._pending_lock:
            pending = self._pending
            room = PENDING_MAX - len(pending)
            if room < len(events):
                self.dropped += len(events) - max(room, 0)
                events = events[: max(room, 0)]
            queued = bool(pending)  # the job queued for the first pending event takes these too
            pending += events
            if queued or not pending:
                return
        if self.writer.submit(self._apply_pending, block=False) is None:
            with self._pending_lock:
                self.dropped += len(self._pending)
                self._pending.clear()

    def _apply_pending(self, conn: sqlite3.Connection) -> None:
        with self._pending_lock:
            events, self._pending = self._pending, []
        self._apply(conn, events)

    def _apply(self, conn: sqlite3.Connection, events: list[dict[str, Any]]) -> Outcome:
        from gpuwatch.store.events import apply_events

        valid = []
        for event in events:
            try:
                valid.append(protocol.validate_event(event)[0])
            except protocol.ProtocolError as e:
                self._reject(1, str(e))
        outcome = apply_events(conn, valid, self.peer)
        for _, _, message in outcome.rejected:
            self._reject(1, message)
        return outcome

    def request(self, msg: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        if msg.get("type") != "events":
            return protocol.error(
                f"{msg.get('type')}: needs the gpuwatch daemon (this run is in embedded mode)", "unavailable"
            )
        try:
            events = protocol.validate(dict(msg, v=protocol.VERSION)).events
        except protocol.ProtocolError as e:
            return protocol.error(str(e), "invalid")
        busy = protocol.error("database busy; try again", "busy")
        applied = self.writer.submit(lambda conn: self._apply(conn, events), timeout=timeout)
        if applied is None:
            return busy
        try:
            outcome = applied.result(timeout)
        except concurrent.futures.TimeoutError:
            return busy
        except Exception:  # rolled back (and a job's own error logged) by the writer
            return protocol.error("database write failed", "store")
        return {"v": protocol.VERSION, **outcome.reply()}

    def flush(self, timeout: float = 10.0) -> bool:
        return self.writer.flush(timeout)

    def close(self, timeout: float = 30.0) -> None:
        # The local disk: every event is written whatever the time it takes (folded steps keep
        # it short); the run's end is in the same transaction as the last steps. The sampler's
        # start (and the lost-run check) may still be under way: it ends before the writer does.
        if self._starting.ident is not None:
            self._starting.join()
        if self.sampler is not None:
            self.sampler.stop()
        self.writer.close()

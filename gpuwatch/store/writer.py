"""The single writer: one thread owns the write connection and batches work into transactions.

A storage failure (disk full, read-only filesystem, I/O error, the file deleted or replaced
under it) is a state, not a stream of tracebacks: one warning when it starts, naming the path
and the bytes free, one line when writing works again. Meanwhile every job is answered
with StoreFailed (ingest tells workloads `store`, so they keep their events spooled), retention runs
early to win space, and `health` says what is wrong for status, doctor, the TUI and /metrics.

The WAL is kept small: every HOUSEKEEPING_S a TRUNCATE checkpoint that never waits for a
reader. A reader that pins the WAL past WAL_LIMIT_BYTES is reported once; the next checkpoint
after it lets go cuts the file back to zero.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future, wait
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from gpuwatch.base import threads
from gpuwatch.base.diskfull import free_bytes
from gpuwatch.base.diskfull import show_bytes as _bytes
from gpuwatch.store.db import StoreError, now_ms, open_rw
from gpuwatch.store.health import StoreHealth

log = logging.getLogger(__name__)

T = TypeVar("T")
Job = Callable[[sqlite3.Connection], None]
OnCommit = Callable[[bool], None]
_STOP = object()
HOUSEKEEPING_S = 5.0  # checkpoint the WAL and check the file is still ours this often
WAL_LIMIT_BYTES = 32 * 1024 * 1024  # a WAL past this that cannot be checkpointed is reported
RECLAIM_EVERY_S = 30.0  # while the disk is full, early retention at most this often
RECOVERED_AFTER_S = 5.0  # writes must work this long before a failure counts as over
BUSY_TIMEOUT_MS = 5000  # as open_rw sets it

# SQLite primary result codes meaning "the file cannot be written now", not "this job is wrong".
_STORAGE_CODES = {
    5: "database is locked",
    6: "database table is locked",
    8: "read-only",
    10: "I/O error",
    11: "database file is corrupt",
    13: "disk full",
    14: "cannot open the database file",
    26: "not a database",
}
_SQLITE_FULL = 13


class JobRefused(Exception):
    """Raised by a job that rolled itself back on purpose: its owner reports why, the writer
    logs nothing (ingest uses it for a frame our own code failed on)."""


class StoreFailed(StoreError):
    """A job's transaction could not be committed (disk full, read-only, locked, the file
    gone): nothing of its batch is durable. The cause is the SQLite error."""


def storage_problem(e: BaseException) -> str | None:
    """What an exception says about the database file ("disk full", ...), or None if it is
    about the job (a constraint, a bug). Python < 3.11 gives no error code: any operational
    error counts."""
    if not isinstance(e, sqlite3.OperationalError | sqlite3.DatabaseError) or isinstance(
        e, sqlite3.IntegrityError | sqlite3.ProgrammingError | sqlite3.InterfaceError
    ):
        return None
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:
        return str(e) if isinstance(e, sqlite3.OperationalError) else None
    return _STORAGE_CODES.get(code & 0xFF)


def insert_sql(table: str, columns: Sequence[str], conflict: str = "") -> str:
    """INSERT [OR conflict] INTO table (columns) VALUES (?, ...)."""
    verb = f"INSERT OR {conflict}" if conflict else "INSERT"
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def insert_rows(
    conn: sqlite3.Connection, table: str, rows: Iterable[Mapping[str, Any]], conflict: str = ""
) -> None:
    """Insert dict rows; rows sharing a column set go in one executemany."""
    groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for row in rows:
        cols = tuple(row)
        groups.setdefault(cols, []).append(tuple(row.values()))
    for cols, values in groups.items():
        conn.executemany(insert_sql(table, cols, conflict), values)


class Writer:
    """Bounded queue of jobs; the thread drains up to `batch` jobs per transaction.

    A job is a callable taking the connection. `submit` hands back a Future that resolves,
    once the transaction holding the job committed, to the job's return value; or to the job's
    own exception (the job alone was rolled back), or StoreFailed (its whole batch was). So
    ingest acknowledges only durable events.
    """

    def __init__(
        self, path: str | os.PathLike[str], batch: int = 2000, maxsize: int = 100_000, linger_s: float = 0.0
    ):
        """linger_s: after the first job of a batch arrives, wait this long for more before
        committing: fewer, larger transactions, and fewer wake-ups of this thread. A flush() or
        close() cuts it short: whoever waits on the database does not wait for the linger."""
        self.path = path
        self.linger_s = linger_s
        self.conn: sqlite3.Connection | None = open_rw(path)
        self._identity = _identity(path)
        self.batch = batch
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self._closed = False
        self.failed_jobs = 0
        self.dropped_jobs = 0
        self.health: StoreHealth | None = None  # set while the database cannot be written
        # Called (on this thread) with `health` whenever it changes; the daemon publishes it.
        self.on_health: Callable[[StoreHealth | None], None] | None = None
        # Early retention for a full disk (None: maintenance.reclaim_raw, the oldest raw samples).
        self.reclaim: Callable[[sqlite3.Connection], object] | None = None
        self._reclaimed_at = 0.0
        self._reclaim_told = False  # early retention's outcome was logged in this episode
        self._ok_since: float | None = None  # while failing: when writes began to work again
        self._housekept_at = time.monotonic()
        self.wal_pinned_bytes = 0  # WAL size when a pinned reader was reported; 0 = not pinned
        self._hurry = threading.Event()  # a flush or close is waiting: cut the linger short
        self._thread = threads.start(threading.Thread(target=self._run, name="gpuwatch-writer", daemon=True))

    def submit(
        self,
        job: Callable[[sqlite3.Connection], T],
        on_commit: OnCommit | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
    ) -> Future[T] | None:
        """Queue a job; its Future, or None (counted in dropped_jobs) if the queue stayed full
        or the writer is closed. block=False never waits: what ingest and samplers should use.
        A refusal is a None, not an exception, so a sampler that drops a tick pays nothing.
        on_commit(ok), for a caller that only needs to know whether the job is durable, runs
        on this writer's thread when the Future resolves. A Future cancelled before the
        writer reached it is skipped."""
        if self._closed:
            return None
        future: Future[T] = Future()
        if on_commit is not None:
            future.add_done_callback(lambda f: on_commit(not f.cancelled() and f.exception() is None))
        try:
            self._queue.put((job, future), block=block, timeout=timeout)
        except queue.Full:
            self.dropped_jobs += 1
            return None
        return future

    def insert(
        self,
        table: str,
        rows: Iterable[Mapping[str, Any]],
        conflict: str = "",
        on_commit: OnCommit | None = None,
        *,
        block: bool = True,
        timeout: float | None = None,
    ) -> Future[None] | None:
        """Insert dict rows in a job of their own (see submit); no rows, no job."""
        rows = list(rows)
        if not rows:
            nothing: Future[None] = Future()
            nothing.set_result(None)
            return nothing
        return self.submit(
            lambda conn: insert_rows(conn, table, rows, conflict), on_commit, block=block, timeout=timeout
        )

    def depth(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every job submitted before this call is done (False on timeout)."""
        done = self.submit(_nothing, timeout=timeout)
        if done is None:
            return False
        self._hurry.set()
        return not wait([done], timeout).not_done

    def close(self) -> None:
        """Commit what is queued, stop the thread and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._hurry.set()
        self._thread.join()
        if self.conn is not None:
            self.conn.close()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=HOUSEKEEPING_S)
            except queue.Empty:
                self._housekeeping()
                continue
            if item is _STOP:
                return
            jobs = [item]
            stop = False
            if self.linger_s:
                self._hurry.wait(self.linger_s)
                self._hurry.clear()
            while len(jobs) < self.batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                jobs.append(nxt)
            self._commit(jobs)
            if time.monotonic() - self._housekept_at >= HOUSEKEEPING_S:
                self._housekeeping()
            if stop:
                return

    def _commit(self, jobs: list[tuple[Callable[[sqlite3.Connection], Any], Future[Any]]]) -> None:
        # Executor's rule: a Future cancelled while queued is not run (and cannot be resolved).
        jobs = [(job, future) for job, future in jobs if future.set_running_or_notify_cancel()]
        results: list[tuple[Future[Any], Any, BaseException | None]] = []
        conn = self.conn
        try:
            if conn is None:
                conn = self._reopen()
            conn.execute("BEGIN IMMEDIATE")
            for job, future in jobs:
                # A savepoint per job: one bad job is rolled back alone, the batch still commits.
                conn.execute("SAVEPOINT job")
                try:
                    value = job(conn)
                    conn.execute("RELEASE job")
                    results.append((future, value, None))
                except Exception as e:  # a buggy job must not kill the thread callers wait on
                    if storage_problem(e):
                        raise  # the file, not the job: the whole batch fails below
                    if not isinstance(e, JobRefused):
                        log.exception("store: a write job failed and was rolled back")
                    self.failed_jobs += 1
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    results.append((future, None, e))
            conn.execute("COMMIT")
        except (sqlite3.Error, StoreError) as e:
            # BEGIN, COMMIT or a write failed (disk full, read-only, database locked past
            # busy_timeout): nothing in this batch is durable, and every caller is told so.
            if conn is not None and conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite may have rolled back by itself
            self.failed_jobs += len(jobs)
            problem = storage_problem(e) or "cannot write"
            self._failing(problem, str(e), len(jobs))
            results = [(future, None, _batch_failed(self.path, problem, e)) for _, future in jobs]
        else:
            if self.health is not None:
                self._maybe_recovered()
        for future, value, error in results:
            # Callbacks (on_commit) run in here; concurrent.futures logs any that fail.
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    # --- storage failures and housekeeping (this thread only) ---

    def _failing(self, problem: str, error: str, jobs: int) -> None:
        self._ok_since = None
        if self.health is None:
            self.health = StoreHealth(
                str(self.path), problem, error, now_ms(), free_bytes(self.path), pid=os.getpid()
            )
            unpublished = self._publish()
            log.warning(
                "store: cannot write %s: %s (%s); %s bytes free on its filesystem. "
                "Samples are dropped and workloads keep their events spooled until it "
                "works again%s",
                self.path,
                problem,
                error,
                _bytes(self.health.free_bytes),
                f"; readers cannot be told either ({unpublished})" if unpublished else "",
            )
        self.health.failed_jobs += jobs
        if (
            problem == _STORAGE_CODES[_SQLITE_FULL]
            and time.monotonic() - self._reclaimed_at >= RECLAIM_EVERY_S
        ):
            self._reclaimed_at = time.monotonic()
            self._reclaim()

    def _maybe_recovered(self) -> None:
        """Writes work again: the state clears once they kept working for RECOVERED_AFTER_S, so
        a disk that frees a little and fills again is one episode, not a warning per flap."""
        now = time.monotonic()
        if self._ok_since is None:
            self._ok_since = now
        elif now - self._ok_since >= RECOVERED_AFTER_S:
            self._recovered()

    def _recovered(self) -> None:
        health, self.health = self.health, None
        assert health is not None  # called only while failing
        self._reclaim_told = False
        log.info(
            "store: writing %s again after %.0f s; %d writes failed meanwhile",
            self.path,
            (now_ms() - health.since_ms) / 1000,
            health.failed_jobs,
        )
        self._publish()

    def _publish(self) -> str:
        """Hand `health` to on_health; '' or why it could not be. A report that cannot be
        written (its disk is full too) is said once, in the episode's warning, not per retry."""
        if self.on_health is not None:
            try:
                self.on_health(self.health)
            except OSError as e:
                return f"{e.filename or 'the health report'}: {e.strerror or e}"
            except Exception:
                log.exception("store: publishing the store's health failed")
                return "publishing failed"
        return ""

    def _reclaim(self) -> None:
        """Win space back on a full disk: empty the WAL, then retention early (raw tier first)."""
        from gpuwatch.store.maintenance import reclaim_raw  # it imports the store package

        if self.conn is None:
            return
        # Said once an episode: every RECLAIM_EVERY_S of a long one would be a line each.
        level, self._reclaim_told = (logging.DEBUG if self._reclaim_told else logging.INFO), True
        try:
            self._checkpoint()
            log.log(
                level,
                "store: early retention on a full disk: %s; %s bytes free now",
                (self.reclaim or reclaim_raw)(self.conn),
                _bytes(free_bytes(self.path)),
            )
        except sqlite3.Error as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            log.log(
                level,
                "store: early retention could not run yet (%s); tried again every %g s",
                e,
                RECLAIM_EVERY_S,
            )

    def _reopen(self) -> sqlite3.Connection:
        """A connection to the file at `path` now (after it was deleted or replaced); a file
        deleted with its directory is not made again (that was someone's decision)."""
        if not os.path.isdir(os.path.dirname(os.path.abspath(self.path))):
            raise StoreError(f"{self.path}: its directory is gone")
        self.conn = open_rw(self.path)  # StoreError if it cannot be: the batch fails, retried later
        self._identity = _identity(self.path)
        return self.conn

    def _housekeeping(self) -> None:
        self._housekept_at = time.monotonic()
        found = _identity(self.path)
        if self.conn is not None and found != self._identity:
            gone = found is None
            log.warning(
                "store: %s was %s while open; %s bytes free on its filesystem; "
                "writing to the file now at that path",
                self.path,
                "deleted" if gone else "replaced",
                _bytes(free_bytes(self.path)),
            )
            try:  # the -wal at that path is the old file's: empty it before the new file meets it
                self._checkpoint()
            except sqlite3.Error:
                pass
            self.conn.close()
            self.conn = None
            try:
                self._reopen()
            except StoreError as e:
                self._failing("deleted" if gone else "replaced", str(e), 0)
                return
        if self.conn is None:
            return
        try:
            self._checkpoint()
        except sqlite3.Error as e:
            problem = storage_problem(e)
            if problem:
                self._failing(problem, str(e), 0)
        if self.health is not None and self._ok_since is not None:
            self._maybe_recovered()
        elif self.health is not None:
            self.health.free_bytes = free_bytes(self.path)
            self._publish()

    def _checkpoint(self) -> None:
        """TRUNCATE checkpoint without waiting: a reader that pins the WAL makes it return busy."""
        conn = self.conn
        assert conn is not None  # the caller checked
        conn.execute("PRAGMA busy_timeout = 0")
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        finally:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        wal = wal_bytes(self.path)
        if busy and wal > WAL_LIMIT_BYTES and not self.wal_pinned_bytes:
            self.wal_pinned_bytes = wal
            log.warning(
                "store: %s-wal is %s bytes and cannot be checkpointed: a reader has held "
                "one read transaction open for long (limit %s bytes); it is cut back once "
                "that reader is done",
                self.path,
                _bytes(wal),
                _bytes(WAL_LIMIT_BYTES),
            )
        elif not busy and self.wal_pinned_bytes:
            log.info("store: %s-wal checkpointed and cut back to %s bytes", self.path, _bytes(wal))
            self.wal_pinned_bytes = 0


def _nothing(conn: sqlite3.Connection) -> None:
    """flush()'s job: its Future resolves once everything queued before it is done."""


def _batch_failed(path: str | os.PathLike[str], problem: str, cause: BaseException) -> StoreFailed:
    """One exception per Future: each caller that raises it gets a traceback of its own."""
    failed = StoreFailed(f"cannot write {path}: {problem} ({cause})")
    failed.__cause__ = cause
    return failed


def wal_bytes(path: str | os.PathLike[str]) -> int:
    try:
        return os.path.getsize(f"{path}-wal")
    except OSError:
        return 0


def _identity(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino

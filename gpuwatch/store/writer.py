"""The single writer: one thread owns the write connection and batches work into transactions."""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from typing import Callable, Iterable, Mapping, Sequence

from gpuwatch.store.db import open_rw

log = logging.getLogger(__name__)

Job = Callable[[sqlite3.Connection], None]
OnCommit = Callable[[bool], None]
_STOP = object()


def insert_sql(table: str, columns: Sequence[str], conflict: str = "") -> str:
    """INSERT [OR conflict] INTO table (columns) VALUES (?, ...)."""
    verb = f"INSERT OR {conflict}" if conflict else "INSERT"
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def insert_rows(conn: sqlite3.Connection, table: str, rows: Iterable[Mapping], conflict: str = "") -> None:
    """Insert dict rows; rows sharing a column set go in one executemany."""
    groups: dict[tuple[str, ...], list[tuple]] = {}
    for row in rows:
        cols = tuple(row)
        groups.setdefault(cols, []).append(tuple(row.values()))
    for cols, values in groups.items():
        conn.executemany(insert_sql(table, cols, conflict), values)


class Writer:
    """Bounded queue of jobs; the thread drains up to `batch` jobs per transaction.

    A job is a callable taking the connection. `on_commit(ok)` callbacks run after the
    transaction holding their job committed (ok=True) or after the job or its transaction
    failed (ok=False), so ingest can acknowledge only durable events.
    """

    def __init__(self, path, batch: int = 2000, maxsize: int = 100_000, linger_s: float = 0.0):
        """linger_s: after the first job of a batch arrives, wait this long for more before
        committing: fewer, larger transactions, and fewer wake-ups of this thread."""
        self.path = path
        self.linger_s = linger_s
        self.conn = open_rw(path)
        self.batch = batch
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._closed = False
        self.failed_jobs = 0
        self.dropped_jobs = 0
        self._thread = threading.Thread(target=self._run, name="gpuwatch-writer", daemon=True)
        self._thread.start()

    def submit(self, job: Job, on_commit: OnCommit | None = None, *, block: bool = True,
               timeout: float | None = None) -> bool:
        """Queue a job; False (and counted in dropped_jobs) if the queue stayed full or the
        writer is closed. block=False never waits: what ingest and samplers should use."""
        if self._closed:
            return False
        try:
            self._queue.put((job, on_commit), block=block, timeout=timeout)
        except queue.Full:
            self.dropped_jobs += 1
            return False
        return True

    def insert(self, table: str, rows: Iterable[Mapping], conflict: str = "",
               on_commit: OnCommit | None = None, *, block: bool = True,
               timeout: float | None = None) -> bool:
        rows = list(rows)
        if not rows:
            return True
        return self.submit(lambda conn: insert_rows(conn, table, rows, conflict), on_commit,
                           block=block, timeout=timeout)

    def depth(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every job submitted before this call is committed (False on timeout)."""
        done = threading.Event()
        if not self.submit(lambda conn: None, lambda ok: done.set(), timeout=timeout):
            return False
        return done.wait(timeout)

    def close(self) -> None:
        """Commit what is queued, stop the thread and close the connection."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        self.conn.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            jobs = [item]
            stop = False
            if self.linger_s:
                time.sleep(self.linger_s)
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
            if stop:
                return

    def _commit(self, jobs: list) -> None:
        results = []
        try:
            self.conn.execute("BEGIN IMMEDIATE")
            for job, on_commit in jobs:
                # A savepoint per job: one bad job is rolled back alone, the batch still commits.
                self.conn.execute("SAVEPOINT job")
                try:
                    job(self.conn)
                    self.conn.execute("RELEASE job")
                    results.append((on_commit, True))
                except Exception:  # a buggy job must not kill the thread callers wait on
                    log.exception("store: a write job failed and was rolled back")
                    self.failed_jobs += 1
                    self.conn.execute("ROLLBACK TO job")
                    self.conn.execute("RELEASE job")
                    results.append((on_commit, False))
            self.conn.execute("COMMIT")
        except sqlite3.Error:
            # BEGIN or COMMIT failed (disk full, database locked past busy_timeout): nothing
            # in this batch is durable, and every caller is told so.
            log.exception("store: a batch of %d jobs could not be committed", len(jobs))
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            self.failed_jobs += len(jobs)
            results = [(on_commit, False) for _, on_commit in jobs]
        for on_commit, ok in results:
            if on_commit is not None:
                try:
                    on_commit(ok)
                except Exception:
                    log.exception("store: on_commit callback failed")

"""The single writer: one thread owns the write connection and batches work into transactions."""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from typing import Callable, Iterable, Mapping, Sequence

from gpuwatch.store.db import open_rw

log = logging.getLogger(__name__)

Job = Callable[[sqlite3.Connection], None]
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
    """Queue of jobs; the thread drains up to `batch` jobs per transaction.

    A job is a callable taking the connection. `on_commit` callbacks run after the
    transaction holding their job committed, so ingest can acknowledge only durable events.
    """

    def __init__(self, path, batch: int = 2000, maxsize: int = 100_000):
        self.path = path
        self.conn = open_rw(path)
        self.batch = batch
        self._queue: queue.Queue = queue.Queue(maxsize=maxsize)
        self._thread = threading.Thread(target=self._run, name="gpuwatch-writer", daemon=True)
        self.failed_jobs = 0
        self._thread.start()

    def submit(self, job: Job, on_commit: Callable[[bool], None] | None = None) -> None:
        """Queue a job; on_commit(ok) is called from the writer thread after the commit."""
        self._queue.put((job, on_commit))

    def insert(self, table: str, rows: Iterable[Mapping], conflict: str = "",
               on_commit: Callable[[bool], None] | None = None) -> None:
        rows = list(rows)
        if rows:
            self.submit(lambda conn: insert_rows(conn, table, rows, conflict), on_commit)

    def depth(self) -> int:
        return self._queue.qsize()

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every job submitted before this call is committed."""
        done = threading.Event()
        self.submit(lambda conn: None, lambda ok: done.set())
        return done.wait(timeout)

    def close(self) -> None:
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
        self.conn.execute("BEGIN IMMEDIATE")
        for job, on_commit in jobs:
            # A savepoint per job: one bad job is rolled back alone, the batch still commits.
            self.conn.execute("SAVEPOINT job")
            try:
                job(self.conn)
                self.conn.execute("RELEASE job")
                results.append((on_commit, True))
            except sqlite3.Error:
                log.exception("store: a write job failed and was rolled back")
                self.failed_jobs += 1
                self.conn.execute("ROLLBACK TO job")
                self.conn.execute("RELEASE job")
                results.append((on_commit, False))
        self.conn.execute("COMMIT")
        for on_commit, ok in results:
            if on_commit is not None:
                try:
                    on_commit(ok)
                except Exception:
                    log.exception("store: on_commit callback failed")

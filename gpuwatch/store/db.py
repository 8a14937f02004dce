"""Opening the database: pragmas, migrations recorded in the database, read-only opens.

Sharing with other accounts: the daemon's database, its -wal and -shm files are created 0644
(SQLite gives -wal/-shm the database file's mode) in a 0755 directory, so any user can read it.
A reader that cannot write there opens with `mode=ro`, which SQLite >= 3.22 allows while the
-wal and -shm files exist (that is, while the daemon has the database open). When they do not
exist (no writer running) and cannot be created, `open_ro` falls back to `immutable=1`: the
file is then a frozen snapshot, marked by `conn.frozen`, and the reader should reopen later.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Iterator, Sequence

from gpuwatch.base.clock import now_ms as now_ms  # re-exported: the store stamps rows with it
from gpuwatch.store import fresh_schema
from gpuwatch.store.schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """The database cannot be used as asked; the message is one line saying why."""


# sqlite3's own base error (a locked, full or corrupt file), for the parts above the store that
# must tell the database's trouble from their own without importing sqlite3.
SQLiteError = sqlite3.Error


class ReadConnection(sqlite3.Connection):
    """A read-only connection; `frozen` is True when opened as an immutable snapshot."""

    frozen = False


def _check_version(conn: sqlite3.Connection, path: Path) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, newer than this gpuwatch understands "
            f"({SCHEMA_VERSION}); upgrade gpuwatch to read it"
        )
    return version


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the missing migrations in one transaction.

    The version is read again under the write lock: the ranks of a job that open one new
    database at the same moment must find it migrated by the first, not apply its migrations
    again. The version lives in user_version (what the code checks); the `migrations` table
    records when each was applied, for humans.
    """
    if _check_version(conn, path) == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = _check_version(conn, path)
        empty = version == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
        if empty and fresh_schema.VERSION == SCHEMA_VERSION:
            # A new database: what the migrations would build, in one script (see schema_dump).
            for statement in fresh_schema.STATEMENTS:
                conn.execute(statement)
            _applied(conn, range(1, SCHEMA_VERSION + 1))
        else:
            apply_migrations(conn, version)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # some errors (a full disk) end the transaction themselves
            conn.execute("ROLLBACK")
        raise


def apply_migrations(conn: sqlite3.Connection, version: int) -> None:
    """The migrations after `version`, one by one, inside the caller's transaction."""
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        if callable(script):  # a change SQL alone cannot make (sqlite-utils, in this transaction)
            script(conn)
        else:
            for statement in _statements(script):
                conn.execute(statement)
        _applied(conn, [number])


def _applied(conn: sqlite3.Connection, numbers: Sequence[int]) -> None:
    """Record migrations `numbers` (in order) as applied: the schema's version is the last."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS migrations (version INTEGER PRIMARY KEY, applied_ms INTEGER NOT NULL)"
    )
    applied_ms = now_ms()
    conn.executemany("INSERT INTO migrations VALUES (?, ?)", [(number, applied_ms) for number in numbers])
    conn.execute(f"PRAGMA user_version = {numbers[-1]}")


def _statements(script: str) -> Iterator[str]:
    """The statements of an SQL script, one at a time (executescript would commit first, so it
    cannot run inside our transaction). A statement ends at the ';' where SQLite would end
    it, so a trigger's inner ';' and one in a string or comment stay inside."""
    statement = ""
    for piece in script.split(";"):
        statement += piece + ";"
        if sqlite3.complete_statement(statement):
            if statement.strip(" \n;"):
                yield statement
            statement = ""


def _create(path: Path, mode: int) -> None:
    if not path.parent.exists():
        # Directories get x wherever the file gets r, so readers can reach the file.
        dir_mode = 0o700 | (mode & 0o044) | ((mode & 0o044) >> 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(path.parent, dir_mode)
    if not path.exists():
        # Create with the final mode (past the umask) so readers in other accounts never see a
        # private file; SQLite copies this mode onto -wal and -shm.
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, mode)
        os.fchmod(fd, mode)
        os.close(fd)


def _wal(conn: sqlite3.Connection, wait_s: float = 5.0) -> None:
    """Switch to WAL. The switch needs a lock that SQLite does not wait for (busy_timeout does
    not apply), so a process that opens a new database beside another one retries briefly."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def open_rw(path: str | os.PathLike[str], *, mode: int = 0o644) -> sqlite3.Connection:
    """Open (creating if needed) for writing, migrate, and set WAL + synchronous=NORMAL."""
    path = Path(path)
    try:
        _create(path, mode)
    except OSError as e:
        raise StoreError(f"{path}: cannot create: {e.strerror}") from None
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
            # Only possible before the first table exists; lets the size cap give space back.
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        _wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        # After a checkpoint the -wal is cut back to this, so a big cleanup does not leave a
        # big -wal behind (the size cap counts the main file only); the writer's periodic
        # TRUNCATE checkpoint empties it.
        conn.execute("PRAGMA journal_size_limit = 4194304")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, path)
    except sqlite3.DatabaseError as e:
        conn.close()
        raise StoreError(f"{path}: cannot open for writing: {e}") from None
    except StoreError:
        conn.close()
        raise
    return conn


def _connect_ro(path: Path, immutable: bool) -> ReadConnection:
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
    # A long-lived reader (the TUI, /metrics) runs a few dozen fixed statements; sqlite3's
    # default cache of 128 would also keep one-off ones (a few MB nobody runs again).
    conn = sqlite3.connect(
        uri,
        uri=True,
        check_same_thread=False,
        isolation_level=None,
        factory=ReadConnection,
        cached_statements=32,
    )
    conn.frozen = immutable
    try:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA query_only = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError:
        conn.close()
        raise
    return conn


def open_ro(path: str | os.PathLike[str], *, cache_kib: int | None = None) -> ReadConnection:
    """Open for reading only; works for users who cannot write the file or its directory.
    cache_kib: SQLite's page cache for this connection, if not its default (2 MB)."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"{path}: no such database (is the daemon running, or has a run been tracked?)")
    try:
        try:
            conn = _connect_ro(path, immutable=False)
        except sqlite3.OperationalError:
            wal = path.with_name(path.name + "-wal")
            if wal.exists() or os.access(path.parent, os.W_OK):
                raise
            # No writer has it open (its last close removed -wal and -shm) and we may not
            # create -shm: the file alone is the whole database, read it as a snapshot.
            log.info("store: %s has no writer; reading it as an immutable snapshot", path)
            conn = _connect_ro(path, immutable=True)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path}: cannot open for reading: {e}") from None
    try:
        version = _check_version(conn, path)
    except (StoreError, sqlite3.DatabaseError) as e:
        conn.close()
        raise StoreError(str(e) if isinstance(e, StoreError) else f"{path}: cannot read: {e}") from None
    if version < SCHEMA_VERSION:
        conn.close()
        raise StoreError(
            f"{path} has schema version {version}; open it once with the daemon "
            f"or a tracked run to upgrade it to {SCHEMA_VERSION}"
        )
    if cache_kib is not None:
        conn.execute(f"PRAGMA cache_size = -{int(cache_kib)}")
    return conn


def data_version(conn: sqlite3.Connection) -> int:
    """A number that changes whenever another connection commits to the file: a reader that
    finds it unchanged may keep what it read last."""
    version: int = conn.execute("PRAGMA data_version").fetchone()[0]
    return version

"""Opening the database: pragmas, migrations recorded in the database, read-only opens."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from gpuwatch.store.schema import MIGRATIONS, SCHEMA_VERSION


class StoreError(RuntimeError):
    """The database cannot be used as asked; the message is one line saying why."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_version(conn: sqlite3.Connection, path: Path) -> int:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, newer than this gpuwatch understands "
            f"({SCHEMA_VERSION}); upgrade gpuwatch to read it")
    return version


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply each missing migration in its own transaction; the version lives in user_version."""
    version = _check_version(conn, path)
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        # executescript commits first, so BEGIN/COMMIT are spelled out to keep it atomic.
        conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")


def open_rw(path: str | os.PathLike, *, mode: int = 0o644) -> sqlite3.Connection:
    """Open (creating if needed) for writing, migrate, and set WAL + synchronous=NORMAL."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Create with the final mode so readers in other accounts never see a private file.
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    try:
        migrate(conn, path)
    except sqlite3.DatabaseError as e:
        conn.close()
        raise StoreError(f"{path}: cannot migrate: {e}") from None
    except StoreError:
        conn.close()
        raise
    return conn


def open_ro(path: str | os.PathLike) -> sqlite3.Connection:
    """Open for reading only; works for users who cannot write the file or its directory."""
    path = Path(path)
    if not path.exists():
        raise StoreError(f"{path}: no such database (is the daemon running, or has a run been tracked?)")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                               check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA query_only = ON")
        version = _check_version(conn, path)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"{path}: cannot open: {e}") from None
    if version < SCHEMA_VERSION:
        conn.close()
        raise StoreError(f"{path} has schema version {version}; open it once with the daemon "
                         f"or a tracked run to upgrade it to {SCHEMA_VERSION}")
    return conn

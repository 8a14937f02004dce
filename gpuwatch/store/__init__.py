"""The SQLite store: schema and migrations, the single writer, read queries, rollups and retention."""

from gpuwatch.store import health
from gpuwatch.store.db import SQLiteError, StoreError, migrate, now_ms, open_ro, open_rw
from gpuwatch.store.writer import Writer, insert_rows

__all__ = [
    "SQLiteError",
    "StoreError",
    "Writer",
    "health",
    "insert_rows",
    "migrate",
    "now_ms",
    "open_ro",
    "open_rw",
]

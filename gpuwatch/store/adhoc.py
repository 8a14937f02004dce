"""A user's own SQL over the database, read-only (`gpuwatch query`)."""

from __future__ import annotations

import sqlite3
from typing import Any

# Statements a read may need; anything else (writes, ATTACH, schema changes) is refused.
_READ_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_PRAGMA,
    getattr(sqlite3, "SQLITE_RECURSIVE", 33),
}


class QueryError(Exception):
    """The statement was refused or failed; the message is one line."""


def _only_reads(action: int, table: str | None, *_args: object) -> int:
    # Connecting a table-valued function (json_each, json_tree) asks for SQLITE_UPDATE on
    # sqlite_master; the connection is read-only and query_only, so nothing can be written.
    if action == sqlite3.SQLITE_UPDATE and table == "sqlite_master":
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def read_only_query(conn: sqlite3.Connection, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run one read-only statement: (column names, rows); QueryError with one line on any failure."""
    conn.set_authorizer(_only_reads)
    try:
        cur = conn.execute(sql)
        rows = cur.fetchall()
    except sqlite3.DatabaseError as e:
        # A write to a raw-sample view fails before the authorizer sees it ("cannot modify").
        if any(m in str(e) for m in ("not authorized", "readonly", "cannot modify")):
            raise QueryError(
                "query is read-only: only SELECT, WITH and PRAGMA reads run; nothing was changed"
            ) from None
        raise QueryError(f"query failed: {e}") from None
    except sqlite3.ProgrammingError as e:  # e.g. two statements at once
        raise QueryError(f"query failed: {e}") from None
    headers = [d[0] for d in cur.description or ()]
    return headers, rows

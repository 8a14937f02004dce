"""`gpuwatch notify when-free` wishes (`alert_wishes`): stored by the daemon's ingest or the CLI,
granted (and deleted) by the gpus.free rule (gpuwatch/alerts/host_rules.py)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Wish:
    id: int
    uid: int
    user: str | None
    host: str
    created_ms: int
    gpus: int
    min_free_bytes: int
    max_util_pct: float
    window_min: float


_COLUMNS = ", ".join(f.name for f in fields(Wish))


def add_wish(
    conn: sqlite3.Connection,
    uid: int,
    user: str | None,
    host: str,
    now: int,
    gpus: int,
    min_free_bytes: int,
    max_util_pct: float = 10.0,
    window_min: float = 5.0,
) -> int:
    """Store a wish (in a writer job, or a connection of its own in embedded mode); its id."""
    cur = conn.execute(
        "INSERT INTO alert_wishes (uid, user, host, created_ms, gpus, min_free_bytes, max_util_pct, "
        "window_min) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (uid, user, host, now, gpus, min_free_bytes, max_util_pct, window_min),
    )
    return int(cur.lastrowid or 0)  # an INSERT into a rowid table always sets it


def wishes(conn: sqlite3.Connection, host: str) -> list[Wish]:
    """The host's wishes, oldest first."""
    return [
        Wish(*row)
        for row in conn.execute(f"SELECT {_COLUMNS} FROM alert_wishes WHERE host = ? ORDER BY id", (host,))
    ]


def forget(conn: sqlite3.Connection, wish_id: int) -> None:
    """A granted wish is done."""
    conn.execute("DELETE FROM alert_wishes WHERE id = ?", (wish_id,))

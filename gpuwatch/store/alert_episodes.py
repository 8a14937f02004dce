"""The alert rules' open episodes (`alert_episodes`): a condition that must hold a while before
it alerts, kept so a restart neither repeats its alert nor restarts its clock. Writes go in a
writer job; gpuwatch/alerts/episodes.py keeps them in memory and calls these only on a change."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True)
class Episode:
    key: str
    since_ms: int
    fired: bool


def episodes(conn: sqlite3.Connection) -> list[Episode]:
    return [
        Episode(key, since, bool(fired))
        for key, since, fired in conn.execute("SELECT key, since_ms, fired FROM alert_episodes")
    ]


def begin(conn: sqlite3.Connection, key: str, since_ms: int) -> None:
    """Episode `key` began at since_ms, not fired yet (replacing a stale one of that key)."""
    conn.execute(
        "INSERT OR REPLACE INTO alert_episodes (key, since_ms, fired) VALUES (?, ?, 0)", (key, since_ms)
    )


def fired(conn: sqlite3.Connection, key: str) -> None:
    conn.execute("UPDATE alert_episodes SET fired = 1 WHERE key = ?", (key,))


def end(conn: sqlite3.Connection, keys: list[str]) -> None:
    conn.executemany("DELETE FROM alert_episodes WHERE key = ?", [(k,) for k in keys])

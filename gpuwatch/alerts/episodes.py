"""Conditions that must hold a while before they alert (a GPU held idle, throttled, a disk low):
one alert per episode, re-armed only after the condition let go.

Open episodes live in memory and in `alert_episodes`, written only on a change (a condition
begins, fires or ends), so a daemon restart neither repeats an alert nor restarts its clock.
Writer thread only: every method takes the writer's connection.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from gpuwatch.store import alert_episodes as stored
from gpuwatch.store.alert_episodes import Episode

if TYPE_CHECKING:
    import sqlite3


class Episodes:
    def __init__(self) -> None:
        self._open: dict[str, Episode] | None = None  # None until loaded

    def _state(self, conn: sqlite3.Connection) -> dict[str, Episode]:
        if self._open is None:
            self._open = {e.key: e for e in stored.episodes(conn)}
        return self._open

    def hold(self, conn: sqlite3.Connection, key: str, ts_ms: int, hold_ms: int) -> int | None:
        """The condition `key` holds at ts_ms. Returns the episode's start once it has held for
        hold_ms and not fired yet (the caller writes its alert, incident f"{key}@{since}")."""
        state = self._state(conn)
        episode = state.get(key)
        if episode is None:
            episode = state[key] = Episode(key, ts_ms, False)
            stored.begin(conn, key, ts_ms)
        if episode.fired or ts_ms - episode.since_ms < hold_ms:
            return None
        state[key] = replace(episode, fired=True)
        stored.fired(conn, key)
        return episode.since_ms

    def open_keys(self, conn: sqlite3.Connection, prefix: str) -> list[str]:
        return [k for k in self._state(conn) if k.startswith(prefix)]

    def release_others(self, conn: sqlite3.Connection, prefix: str, holding: set[str]) -> None:
        """Every open episode whose key starts with `prefix` and is not in `holding` ended."""
        state = self._state(conn)
        ended = [k for k in state if k.startswith(prefix) and k not in holding]
        for key in ended:
            del state[key]
        if ended:
            stored.end(conn, ended)

    def release(self, conn: sqlite3.Connection, key: str) -> None:
        """The condition `key` no longer holds: its next episode may alert again."""
        if self._state(conn).pop(key, None) is not None:
            stored.end(conn, [key])


def incident(key: str, since_ms: int) -> str:
    return f"{key}@{since_ms}"

"""What the alert rules and their delivery read of runs and steps, beyond a run's own row
(queries.run_by_id) and the running runs (running.py): runs that ended since a moment, a
wrapper's ranks, a run's recent rates, the owners of a run name."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

# A host's runs (a run recorded before hosts were stored belongs to whoever reads it), not a
# `gpuwatch run` wrapper's ranks: their wrapper's run speaks for them.
_OURS = "(host = ? OR host IS NULL) AND parent_run_id IS NULL"


def ended_since(conn: sqlite3.Connection, host: str, since_ms: int) -> list[str]:
    """Ids of the host's runs that ended at or after since_ms and have no alert for their end
    yet (its incident is the run's id): each start of the rules looks back hours, and a sweep
    of short runs would otherwise build every one's alert again, to be ignored."""
    return [
        r
        for (r,) in conn.execute(
            f"SELECT run_id FROM runs WHERE status != 'running' AND ended_ms >= ? AND {_OURS} "
            "AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.run_id = runs.run_id AND a.incident = runs.run_id)",
            (since_ms, host),
        )
    ]


def started_and_ended_since(conn: sqlite3.Connection, host: str, since_ms: int) -> list[str]:
    """Ids of the host's runs that started at or after since_ms and are no longer running (the
    runs_started index makes this a look at the last few seconds' runs)."""
    return [
        r
        for (r,) in conn.execute(
            f"SELECT run_id FROM runs WHERE started_ms >= ? AND status != 'running' AND {_OURS}",
            (since_ms, host),
        )
    ]


def rank_run_ids(conn: sqlite3.Connection, run_id: str) -> list[str]:
    """The runs that joined `gpuwatch run` wrapper run_id (its instrumented children)."""
    return [r for (r,) in conn.execute("SELECT run_id FROM runs WHERE parent_run_id = ?", (run_id,))]


@dataclass(frozen=True)
class RecentRates:
    """The tokens/s of a run's newest step rows (those that have one), split at a moment."""

    since: list[float]  # rows at or after it, newest first
    before: list[float]  # the older rows, newest first


def recent_rates(conn: sqlite3.Connection, run_id: str, split_ms: int, rows: int) -> RecentRates:
    """Of the run's newest `rows` step rows, the rates since split_ms and before it: two lists,
    not a record a row, for a rule that reads thousands of rows a run every few seconds."""
    found = conn.execute(
        "SELECT ts_ms, tokens_per_s FROM steps WHERE run_id = ? ORDER BY step DESC LIMIT ?", (run_id, rows)
    ).fetchall()
    return RecentRates(
        since=[rate for ts, rate in found if ts >= split_ms and rate is not None],
        before=[rate for ts, rate in found if ts < split_ms and rate is not None],
    )


def owners(conn: sqlite3.Connection, *, name: str | None = None, run_id: str | None = None) -> set[int]:
    """The uids of the runs with this name, or this id."""
    column, value = ("name", name) if name is not None else ("run_id", run_id)
    return {uid for (uid,) in conn.execute(f"SELECT DISTINCT uid FROM runs WHERE {column} = ?", (value,))}

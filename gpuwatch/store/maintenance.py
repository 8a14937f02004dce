"""Rollups, retention and the size cap, run every minute in the writer thread.

Order of work, each step safe to repeat:
1. Roll complete 15-minute periods of raw GPU/host samples into *_15m and complete hours of
   *_15m into *_1h. `rollup_state` keeps, per tier, the time before which everything is
   folded in, so re-running never double counts (a sample that arrives later than that mark
   is not rolled up).
2. Retention: raw samples (gpu_samples, gpu_process_samples, mig_samples, gpu_prof_samples,
   host_samples, daemon_stats) older than the raw window go, but GPU/host samples only once rolled up;
   *_15m older than its window (the config's minute_retention_days) once rolled into *_1h;
   *_1h older than its window. Age is counted from `retention_now_ms` (see maintain()).
3. Size cap: once the file is larger than max_db_bytes, give its free pages back
   (incremental_vacuum); while still larger, delete the oldest raw samples in chunks, then the
   oldest *_15m, then *_1h, giving pages back likewise. Runs,
   steps, postmortems and everything else that hangs off a run are deleted (oldest finished
   run first) only when no sample of any tier is left. The size counted is the main database
   file's pages; the -wal file comes on top and is shrunk when the writer checkpoints it.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.store.queries import HOUR_MS, distinct_keys
from gpuwatch.store.schema import GPU_METRICS, HOST_METRICS, QUARTER_HOUR_MS, coarser_values, rollup_avg

# A period counts as complete this long after it ends, so samples still queued get in first.
ROLLUP_LAG_MS = 10_000
# Raw sample tables and the key that leads their primary key (None: the key is ts_ms).
RAW_TABLES = {
    "gpu_samples": "gpu_index",
    "gpu_process_samples": "gpu_index",
    "mig_samples": "gpu_index",
    "gpu_prof_samples": "gpu_index",
    "host_samples": None,
    "daemon_stats": None,
    "host_top_processes": None,
}
ROLLUP_SOURCES = (("gpu_samples", "gpu_index", GPU_METRICS), ("host_samples", None, HOST_METRICS))
# Deleted with a run when the size cap leaves nothing else; each has a run_id column.
RUN_TABLES = (
    "steps",
    "generations",
    "memory_stats",
    "run_events",
    "oom_postmortems",
    "stack_dumps",
    "run_notes",
)
# Chunks for the size cap: the oldest 1/CAP_CHUNKS of a tier's time span (at least a period).
CAP_CHUNKS = 20


@dataclass
class MaintenanceReport:
    rolled_up: dict[str, int] = field(default_factory=dict)  # tier -> rows written
    retention_deleted: dict[str, int] = field(default_factory=dict)  # table -> rows
    cap_deleted: dict[str, int] = field(default_factory=dict)  # table -> rows
    runs_deleted: int = 0
    db_bytes_before: int = 0
    db_bytes_after: int = 0
    over_cap: bool = False  # still over the cap with nothing left that may be deleted

    def __str__(self) -> str:
        parts = [f"db {self.db_bytes_before} -> {self.db_bytes_after} bytes"]
        for label, counts in (
            ("rolled up", self.rolled_up),
            ("expired", self.retention_deleted),
            ("capped", self.cap_deleted),
        ):
            if any(counts.values()):
                parts.append(f"{label}: " + ", ".join(f"{t} {n}" for t, n in counts.items() if n))
        if self.runs_deleted:
            parts.append(f"runs deleted for the size cap: {self.runs_deleted}")
        if self.over_cap:
            parts.append("still over the size cap")
        return "; ".join(parts)


def maintain(
    conn: sqlite3.Connection,
    now_ms: int,
    *,
    raw_retention_ms: int,
    minute_retention_ms: int,
    hour_retention_ms: int,
    max_db_bytes: int,
    retention_now_ms: int | None = None,
) -> MaintenanceReport:
    """Roll up, expire and cap. Rollups follow the samples' wall-clock times (`now_ms`);
    retention measures age from `retention_now_ms` (default now_ms), which the sampler keeps
    from running ahead of monotonic time (clock.SteadyWall), so a wall clock stepped forward
    never expires data younger than its window. Inside a transaction (the writer's) it joins
    it; on an autocommit connection it runs in its own transaction and then checkpoints the
    WAL so the file on disk shrinks at once."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN IMMEDIATE")
    try:
        report = MaintenanceReport(db_bytes_before=db_bytes(conn))
        for table, key, metrics in ROLLUP_SOURCES:
            report.rolled_up[f"{table}_15m"] = _roll_quarter_hours(conn, table, key, metrics, now_ms)
            report.rolled_up[f"{table}_1h"] = _roll_hours(conn, table, key, metrics, now_ms)
        _expire(
            conn,
            now_ms if retention_now_ms is None else retention_now_ms,
            raw_retention_ms,
            minute_retention_ms,
            hour_retention_ms,
            report,
        )
        _enforce_cap(conn, max_db_bytes, report)
        report.db_bytes_after = db_bytes(conn)
    except BaseException:
        if own:
            conn.execute("ROLLBACK")
        raise
    if own:
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return report


def db_bytes(conn: sqlite3.Connection) -> int:
    """Size of the main database as this connection sees it, free pages included."""
    pages: int = conn.execute("PRAGMA page_count").fetchone()[0]
    page_bytes: int = conn.execute("PRAGMA page_size").fetchone()[0]
    return pages * page_bytes


# --- helpers over keyed sample tables ---------------------------------------------------------


def _key_filter(table: str, key: str | None) -> tuple[str, str]:
    """(CTE prefix, WHERE prefix) that let a ts_ms range use the (key, ts_ms) primary key."""
    if key is None:
        return "", ""
    return distinct_keys(table, key), f"{key} IN (SELECT k FROM keys) AND "


def _oldest(conn: sqlite3.Connection, table: str, key: str | None) -> int | None:
    if key is None:
        sql = f"SELECT min(ts_ms) FROM {table}"
    else:
        sql = distinct_keys(table, key) + (
            f"SELECT min((SELECT min(ts_ms) FROM {table} WHERE {key} = keys.k)) FROM keys"
        )
    oldest: int | None = conn.execute(sql).fetchone()[0]
    return oldest


def _newest(conn: sqlite3.Connection, table: str, key: str | None) -> int | None:
    if key is None:
        sql = f"SELECT max(ts_ms) FROM {table}"
    else:
        sql = distinct_keys(table, key) + (
            f"SELECT max((SELECT max(ts_ms) FROM {table} WHERE {key} = keys.k)) FROM keys"
        )
    newest: int | None = conn.execute(sql).fetchone()[0]
    return newest


def _changed(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> int:
    """Rows a statement changed (cursor.rowcount is -1 for statements that start with WITH)."""
    before = conn.total_changes
    conn.execute(sql, params)
    return conn.total_changes - before


def _delete_before(conn: sqlite3.Connection, table: str, key: str | None, cutoff_ms: int) -> int:
    """Delete samples older than cutoff_ms; returns how many."""
    cte, where = _key_filter(table, key)
    return _changed(conn, f"{cte}DELETE FROM {table} WHERE {where}ts_ms < ?", (cutoff_ms,))


# --- rollups ----------------------------------------------------------------------------------


def _done_until(conn: sqlite3.Connection, tier: str) -> int | None:
    row = conn.execute("SELECT done_until_ms FROM rollup_state WHERE tier = ?", (tier,)).fetchone()
    return row[0] if row else None


def _set_done_until(conn: sqlite3.Connection, tier: str, until_ms: int) -> None:
    conn.execute("INSERT OR REPLACE INTO rollup_state (tier, done_until_ms) VALUES (?, ?)", (tier, until_ms))


def _roll(
    conn: sqlite3.Connection,
    source: str,
    dest: str,
    key: str | None,
    period_ms: int,
    until_ms: int,
    columns: list[str],
    values: str,
) -> int:
    """Fold source rows in [done_until, until_ms) into dest periods; returns rows written."""
    since = _done_until(conn, dest)
    if since is not None and until_ms <= since:
        return 0
    cte, where = _key_filter(source, key)
    key_select = f"{key}, " if key else ""
    key_col = f"{key}, " if key else ""
    rows = _changed(
        conn,
        f"{cte}INSERT OR REPLACE INTO {dest} ({key_col}ts_ms, n, {', '.join(columns)}) "
        f"SELECT {key_select}(ts_ms / {period_ms}) * {period_ms} AS period, {values} "
        f"FROM {source} WHERE {where}ts_ms >= ? AND ts_ms < ? "
        f"GROUP BY {key_select}period",
        (since or 0, until_ms),
    )
    _set_done_until(conn, dest, until_ms)
    return rows


def _tier_columns(metrics: tuple[str, ...]) -> list[str]:
    return [f"{m}_{agg}" for m in metrics for agg in ("min", "avg", "max")]


def _roll_quarter_hours(
    conn: sqlite3.Connection, table: str, key: str | None, metrics: tuple[str, ...], now_ms: int
) -> int:
    until = (now_ms - ROLLUP_LAG_MS) // QUARTER_HOUR_MS * QUARTER_HOUR_MS
    values = "count(*), " + ", ".join(f"min({m}), {rollup_avg(m, f'avg({m})')}, max({m})" for m in metrics)
    return _roll(conn, table, f"{table}_15m", key, QUARTER_HOUR_MS, until, _tier_columns(metrics), values)


def _roll_hours(
    conn: sqlite3.Connection, table: str, key: str | None, metrics: tuple[str, ...], now_ms: int
) -> int:
    periods_done = _done_until(conn, f"{table}_15m") or 0
    until = min(now_ms - ROLLUP_LAG_MS, periods_done) // HOUR_MS * HOUR_MS
    return _roll(
        conn,
        f"{table}_15m",
        f"{table}_1h",
        key,
        HOUR_MS,
        until,
        _tier_columns(metrics),
        coarser_values(metrics),
    )


# --- retention --------------------------------------------------------------------------------


def _expire(
    conn: sqlite3.Connection,
    now_ms: int,
    raw_ms: int,
    minute_ms: int,
    hour_ms: int,
    report: MaintenanceReport,
) -> None:
    rolled = {table: table for table, _, _ in ROLLUP_SOURCES}
    for table, key in RAW_TABLES.items():
        cutoff = now_ms - raw_ms
        if table in rolled:  # never drop what the 15-minute tier has not folded in yet
            cutoff = min(cutoff, _done_until(conn, f"{table}_15m") or 0)
        report.retention_deleted[table] = _delete_before(conn, table, key, cutoff)
    for table, key, _ in ROLLUP_SOURCES:
        cutoff = min(now_ms - minute_ms, _done_until(conn, f"{table}_1h") or 0)
        report.retention_deleted[f"{table}_15m"] = _delete_before(conn, f"{table}_15m", key, cutoff)
        report.retention_deleted[f"{table}_1h"] = _delete_before(conn, f"{table}_1h", key, now_ms - hour_ms)


# --- size cap ---------------------------------------------------------------------------------


def _used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes the file keeps after incremental_vacuum; on a database created without
    auto_vacuum free pages cannot be given back, so only used pages are counted."""
    free: int = conn.execute("PRAGMA freelist_count").fetchone()[0]
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
        # The pragma frees one page per step and Python's sqlite3 steps a statement that
        # returns no columns only once, so it is run once per free page (~10 us each).
        for _ in range(free):
            conn.execute("PRAGMA incremental_vacuum")
        return db_bytes(conn)
    page_bytes: int = conn.execute("PRAGMA page_size").fetchone()[0]
    return db_bytes(conn) - free * page_bytes


def _enforce_cap(conn: sqlite3.Connection, max_db_bytes: int, report: MaintenanceReport) -> None:
    # A file within the cap keeps its free pages: retention frees some every minute and new
    # samples reuse them, where giving them back would move pages about every minute.
    if db_bytes(conn) <= max_db_bytes or _used_bytes(conn) <= max_db_bytes:
        return
    raw = list(RAW_TABLES.items())
    minutes = [(f"{t}_15m", k) for t, k, _ in ROLLUP_SOURCES]
    hours = [(f"{t}_1h", k) for t, k, _ in ROLLUP_SOURCES]
    for group, period in ((raw, 1000), (minutes, QUARTER_HOUR_MS), (hours, HOUR_MS)):
        while _used_bytes(conn) > max_db_bytes:
            if not _delete_oldest_chunk(conn, group, period, report):
                break
        else:
            return
    while _used_bytes(conn) > max_db_bytes:
        if not _delete_oldest_run(conn):
            report.over_cap = True
            return
        report.runs_deleted += 1


def _delete_oldest_chunk(
    conn: sqlite3.Connection, group: list[tuple[str, str | None]], period_ms: int, report: MaintenanceReport
) -> bool:
    """Delete the oldest 1/CAP_CHUNKS of the group's time span from every table in it."""
    found = [(_oldest(conn, t, k), _newest(conn, t, k)) for t, k in group]
    spans = [(lo, hi) for lo, hi in found if lo is not None and hi is not None]
    if not spans:
        return False
    oldest = min(lo for lo, _ in spans)
    newest = max(hi for _, hi in spans)
    cutoff = oldest + max((newest - oldest) // CAP_CHUNKS, period_ms)
    for table, key in group:
        report.cap_deleted[table] = report.cap_deleted.get(table, 0) + _delete_before(
            conn, table, key, cutoff
        )
    return True


def _delete_oldest_run(conn: sqlite3.Connection) -> bool:
    """Delete the oldest run that is not running, with everything hanging off it."""
    row = conn.execute(
        "SELECT run_id FROM runs WHERE status != 'running' ORDER BY started_ms LIMIT 1"
    ).fetchone()
    if row is None:
        return False
    run_id = row[0]
    for table in ("profile_ops", "profile_breakdowns"):
        conn.execute(
            f"DELETE FROM {table} WHERE profile_id IN (SELECT id FROM profiles WHERE run_id = ?)", (run_id,)
        )
    for table in RUN_TABLES + ("profiles",):
        conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
    conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    return True


def reclaim_raw(conn: sqlite3.Connection, chunks: int = 2) -> MaintenanceReport:
    """Space back on a full disk, early: the oldest raw samples only (`chunks` times the
    oldest 1/CAP_CHUNKS of their span; long rolled up), pages given back to the filesystem.
    On an autocommit connection, in its own transaction, then the WAL is emptied."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        report = MaintenanceReport(db_bytes_before=db_bytes(conn))
        for _ in range(chunks):
            if not _delete_oldest_chunk(conn, list(RAW_TABLES.items()), 1000, report):
                break
        _used_bytes(conn)  # incremental_vacuum: freed pages go back to the filesystem
        report.db_bytes_after = db_bytes(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return report

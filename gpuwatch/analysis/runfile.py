"""One run as a self-contained SQLite file: `gpuwatch export RUN --format sqlite FILE`.

The file has the whole gpuwatch schema (made by the same migrations as the store, so
`gpuwatch show --db FILE`, `compare`, `report` and `browse` read it like any database) and
holds one run: its row, steps, generations, memory stats, events, OOM postmortems, profiles
with their operator breakdowns, stack dumps, notes, its processes, its GPUs and their samples
over its lifetime, and the GPU-process samples of those GPUs then: other users' processes
appear there by pid and memory alone (no user, no command), enough for the run's share of its
GPUs' energy to come out the same. Rows are copied with sqlite-utils' `insert_all`. It is left in rollback journal
mode: one file, nothing beside it, to mail to a colleague.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuwatch.analysis.export import ExportError
from gpuwatch.analysis.rundata import run_gpus, run_window
from gpuwatch.store import open_rw, queries
from gpuwatch.store.queries import PROCESS_TICK_SLACK_MS
from gpuwatch.store.sqlite_utils_db import sqlite_utils_database

# Tables whose rows hang off the run by run_id (profile_ops and profile_breakdowns hang off
# profiles).
RUN_TABLES = (
    "steps",
    "generations",
    "memory_stats",
    "run_events",
    "oom_postmortems",
    "profiles",
    "stack_dumps",
    "run_notes",
)


def _rows(cur: sqlite3.Cursor):
    cols = [d[0] for d in cur.description]
    return (dict(zip(cols, r)) for r in cur)


def write_run_file(conn: sqlite3.Connection, ref: str, path: Path) -> dict[str, int]:
    """Write run `ref` of `conn` to a new SQLite file at `path`; {table: rows written}."""
    if path.exists():
        raise ExportError(f"{path} exists; give a new file name")
    run = queries.run(conn, ref)
    start, end = run_window(conn, run)
    gpus = run_gpus(conn, run)
    try:
        out = open_rw(path, mode=0o644)  # readable by the colleague it is for
    except Exception:
        path.unlink(missing_ok=True)
        raise
    counts: dict[str, int] = {}
    try:
        with sqlite_utils_database(out) as db, out:
            out.execute("BEGIN")

            def copy(table: str, sql: str, params=()) -> None:
                rows = list(_rows(conn.execute(sql, params)))
                if rows:
                    db[table].insert_all(rows)
                counts[table] = len(rows)

            copy("runs", "SELECT * FROM runs WHERE run_id = ?", (run.run_id,))
            for table in RUN_TABLES:
                copy(table, f"SELECT * FROM {table} WHERE run_id = ?", (run.run_id,))
            for table in ("profile_ops", "profile_breakdowns"):
                copy(
                    table,
                    f"SELECT * FROM {table} WHERE profile_id IN (SELECT id FROM profiles WHERE run_id = ?)",
                    (run.run_id,),
                )
            marks = ", ".join("?" * len(gpus))
            copy("processes", "SELECT * FROM processes WHERE run_id = ? OR pid = ?", (run.run_id, run.pid))
            copy("gpus", f"SELECT * FROM gpus WHERE gpu_index IN ({marks})", gpus)
            copy(
                "gpu_process_samples",
                f"SELECT * FROM gpu_process_samples WHERE gpu_index IN ({marks}) "
                "AND ts_ms >= ? AND ts_ms <= ? ORDER BY gpu_index, ts_ms",
                (*gpus, start - PROCESS_TICK_SLACK_MS, end),
            )
            copy(
                "gpu_samples",
                f"SELECT * FROM gpu_samples WHERE gpu_index IN ({marks}) "
                "AND ts_ms >= ? AND ts_ms <= ? ORDER BY gpu_index, ts_ms",
                (*gpus, start, end),
            )
        out.execute("PRAGMA journal_mode = DELETE")
    except BaseException:
        out.close()
        path.unlink(missing_ok=True)
        raise
    out.close()
    return counts

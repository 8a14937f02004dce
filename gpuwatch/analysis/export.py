"""A run's data as files: the run row, its steps, its GPUs' samples over its lifetime, its events."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

from gpuwatch.analysis.rundata import run_gpus, run_window
from gpuwatch.store import queries

FORMATS = ("csv", "json", "parquet")
TABLES = ("run", "steps", "gpu_samples", "run_events")


class ExportError(RuntimeError):
    """The export cannot be written as asked; one line saying why."""


def _rows(cur: sqlite3.Cursor) -> list[dict]:
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def run_tables(conn: sqlite3.Connection, ref: str) -> dict[str, list[dict]]:
    """{table: rows} for one run; gpu_samples are the raw samples still kept (see retention)."""
    run = queries.run(conn, ref)
    start, end = run_window(conn, run)
    gpus = run_gpus(conn, run)
    marks = ", ".join("?" * len(gpus))
    samples = (
        _rows(
            conn.execute(
                f"SELECT * FROM gpu_samples WHERE gpu_index IN ({marks}) AND ts_ms >= ? AND ts_ms <= ? "
                "ORDER BY ts_ms, gpu_index",
                (*gpus, start, end),
            )
        )
        if gpus
        else []
    )
    return {
        "run": _rows(conn.execute("SELECT * FROM runs WHERE run_id = ?", (run.run_id,))),
        "steps": _rows(conn.execute("SELECT * FROM steps WHERE run_id = ? ORDER BY step", (run.run_id,))),
        "gpu_samples": samples,
        "run_events": _rows(
            conn.execute("SELECT * FROM run_events WHERE run_id = ? ORDER BY seq", (run.run_id,))
        ),
    }


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    name = "runs" if table == "run" else table
    return [r[1] for r in conn.execute(f"PRAGMA table_info({name})")]


def write_json(tables: dict[str, list[dict]], out) -> None:
    """One document: {"run": {...}, "steps": [...], "gpu_samples": [...], "run_events": [...]}."""
    doc = {"run": tables["run"][0], **{t: tables[t] for t in TABLES[1:]}}
    json.dump(doc, out, indent=1)
    out.write("\n")


def write_files(
    conn: sqlite3.Connection, tables: dict[str, list[dict]], fmt: str, directory: Path
) -> list[Path]:
    """One file per table in `directory` (csv or parquet); tables with no rows still get a header/schema."""
    if fmt == "parquet":
        try:
            import pyarrow
            import pyarrow.parquet
        except ImportError:
            raise ExportError("parquet export needs pyarrow: pip install pyarrow") from None
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for table in TABLES:
        columns = _columns(conn, table)
        path = directory / f"{table}.{fmt}"
        if fmt == "csv":
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(tables[table])
        else:
            data = {c: [row[c] for row in tables[table]] for c in columns}
            pyarrow.parquet.write_table(pyarrow.table(data), path)
        written.append(path)
    return written

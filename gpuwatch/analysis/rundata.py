"""What the analyses share about one run: its time window and the GPUs it ran on."""

from __future__ import annotations

import sqlite3

from gpuwatch.store import now_ms
from gpuwatch.store.queries import Run, every_gpu


def run_window(conn: sqlite3.Connection, run: Run) -> tuple[int, int]:
    """(start_ms, end_ms): from the start to the end, else the newest step, else now (running)."""
    if run.ended_ms is not None:
        return run.started_ms, max(run.ended_ms, run.started_ms)
    if run.status == "running":
        return run.started_ms, now_ms()
    newest = conn.execute("SELECT max(ts_ms) FROM steps WHERE run_id = ?", (run.run_id,)).fetchone()[0]
    ends = [t for t in (run.last_step_ms, newest) if t is not None]
    return run.started_ms, max([run.started_ms, *ends])


def run_gpus(conn: sqlite3.Connection, run: Run) -> list[int]:
    """GPU indexes of the run: its CUDA_VISIBLE_DEVICES (indexes or UUIDs) and every GPU where one
    of its processes (processes.run_id, or the run's own pid) was seen during its lifetime."""
    uuid_to_index = dict(conn.execute("SELECT uuid, gpu_index FROM gpus"))
    found: set[int] = set()
    for token in (run.gpu_uuids or "").split(","):
        token = token.strip()
        if token.isdigit():
            found.add(int(token))
        elif token in uuid_to_index:
            found.add(uuid_to_index[token])
    start, end = run_window(conn, run)
    rows = conn.execute(
        f"SELECT DISTINCT gpu_index FROM gpu_process_samples "
        f"WHERE gpu_index IN {every_gpu('gpu_process_samples')} AND ts_ms >= ? AND ts_ms <= ? "
        "AND pid IN (SELECT pid FROM processes WHERE run_id = ? UNION SELECT ? WHERE ? IS NOT NULL)",
        (start, end, run.run_id, run.pid, run.pid),
    )
    found.update(idx for (idx,) in rows)
    return sorted(found)

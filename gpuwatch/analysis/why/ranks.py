"""A multi-rank job (runs sharing job_id): the slowest rank, and what slowed it, while this
rank waits for it in every collective."""

from __future__ import annotations

import sqlite3
from dataclasses import replace

from gpuwatch.analysis.why import gpu, host
from gpuwatch.analysis.why.gpu import Candidate
from gpuwatch.analysis.why.window import Window, make_window
from gpuwatch.store import queries


def local_causes(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """What one rank's own GPUs and host show in the window."""
    return gpu.cotenants(conn, w) + gpu.gpu_state(conn, w) + host.cpu(conn, w) + host.memory(conn, w)


def straggler(conn: sqlite3.Connection, w: Window) -> list[Candidate]:
    """The other rank of the job whose own GPUs or host explain the most of the window."""
    if not w.run.job_id:
        return []
    best: tuple[float, str, Candidate] | None = None
    for (run_id,) in conn.execute(
        "SELECT run_id FROM runs WHERE job_id = ? AND run_id != ?", (w.run.job_id, w.run.run_id)
    ).fetchall():
        other = queries.run(conn, run_id)
        ow = make_window(
            conn, other, w.start_ms, w.end_ms, (w.base_start_ms, w.base_end_ms), w.extra, 0.0, None
        )
        ow = replace(ow, gpus=tuple(g for g in ow.gpus if g not in w.gpus) or ow.gpus)
        found = sorted(local_causes(conn, ow), key=lambda c: -c[0])
        if found and (best is None or found[0][0] > best[0]):
            rank = other.rank if other.rank is not None else "?"
            best = (found[0][0], f"rank {rank} (run {other.run_id})", found[0])
    if best is None:
        return []
    expected, who, (_, fields) = best
    return [
        (
            expected,
            dict(
                fields,
                kind="straggler_rank",
                detail=f"{who} is the slowest rank and this one waits for it: {fields['detail']}",
            ),
        )
    ]

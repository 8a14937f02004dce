"""Each GPU over a recent window of samples (`gpuwatch pick` judges by these, never one instant)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from gpuwatch.store.queries import every_gpu


@dataclass(frozen=True)
class GpuWindow:
    gpu_index: int
    min_free_bytes: int | None  # the least free memory seen in the window
    mean_util_pct: float | None  # mean utilisation over the window
    users: tuple[str, ...]  # users whose processes held memory in the window, sorted
    lost: bool  # lost or hung at some point (or now)


# Samples are read GPU by GPU (every_gpu) so the window seeks the (gpu_index, ts_ms) key.
_WINDOW_SQL = f"""
SELECT g.gpu_index, min(g.mem_free_bytes), avg(g.gpu_util_pct),
       max(CASE WHEN g.state IN ('lost', 'hung') THEN 1 ELSE 0 END) OR max(i.state IN ('lost', 'hung'))
FROM gpu_samples g JOIN gpus i USING (gpu_index)
WHERE g.gpu_index IN {every_gpu("gpu_samples")} AND g.ts_ms >= ?
GROUP BY g.gpu_index ORDER BY g.gpu_index
"""
_USERS_SQL = f"""
SELECT DISTINCT s.gpu_index, coalesce(p.user, 'uid ' || p.uid, 'pid ' || s.pid)
FROM gpu_process_samples s
LEFT JOIN processes p ON p.pid = s.pid AND s.ts_ms BETWEEN p.first_seen_ms AND p.last_seen_ms
WHERE s.gpu_index IN {every_gpu("gpu_process_samples")} AND s.ts_ms >= ?
"""


def gpu_windows(conn: sqlite3.Connection, since_ms: int) -> list[GpuWindow]:
    """This machine's GPUs over the window starting at since_ms, in index order."""
    users: dict[int, set[str]] = {}
    for index, user in conn.execute(_USERS_SQL, (since_ms,)):
        users.setdefault(index, set()).add(user)
    return [
        GpuWindow(index, free, util, tuple(sorted(users.get(index, ()))), bool(lost))
        for index, free, util, lost in conn.execute(_WINDOW_SQL, (since_ms,))
    ]

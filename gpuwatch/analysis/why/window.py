"""The windows a cause is judged on: the slow one, and a steady one of the same run to compare
it with; and the run's own processes, which are never a cause of its own slowdown."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from gpuwatch.analysis.rundata import run_gpus
from gpuwatch.store.queries import Run

# The steady window compared with a slow one: the nearest steady phase, at most this long.
BASE_MAX_MS = 600_000


@dataclass(frozen=True)
class Window:
    run: Run
    gpus: tuple[int, ...]
    own_pids: frozenset[int]
    start_ms: int
    end_ms: int
    base_start_ms: int
    base_end_ms: int
    extra: float  # the slowdown: extra time per unit over the steady level (0.4 = 40 %)
    wait_extra: float  # of which waiting for data, in the same units
    units_ratio: float | None  # tokens per step in the window over the steady window's

    def span(self, base: bool = False) -> tuple[int, int]:
        return (self.base_start_ms, self.base_end_ms) if base else (self.start_ms, self.end_ms)


def own_pids(conn: sqlite3.Connection, run: Run) -> frozenset[int]:
    """The pids of the run and of every run of its job (they share its GPUs by design)."""
    ids = [run.run_id]
    if run.job_id:
        ids += [r for (r,) in conn.execute("SELECT run_id FROM runs WHERE job_id = ?", (run.job_id,))]
    marks = ",".join("?" * len(ids))
    pids = {p for (p,) in conn.execute(f"SELECT pid FROM processes WHERE run_id IN ({marks})", ids)}
    pids |= {
        p for (p,) in conn.execute(f"SELECT pid FROM runs WHERE run_id IN ({marks}) AND pid IS NOT NULL", ids)
    }
    return frozenset(pids)


def make_window(
    conn: sqlite3.Connection,
    run: Run,
    start_ms: int,
    end_ms: int,
    base: tuple[int, int],
    extra: float,
    wait_extra: float,
    units_ratio: float | None,
) -> Window:
    return Window(
        run,
        tuple(run_gpus(conn, run)),
        own_pids(conn, run),
        start_ms,
        end_ms,
        base[0],
        base[1],
        extra,
        wait_extra,
        units_ratio,
    )


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None

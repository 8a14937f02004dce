"""Read side of profiles and their top operators, stack dumps and capacity studies (CLI and TUI)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from gpuwatch.store.queries import _build, columns_of


@dataclass(frozen=True)
class Profile:
    id: int
    run_id: str
    ts_ms: int
    rank: int | None
    trigger: str
    first_step: int | None
    steps: int | None
    trace_path: str | None
    trace_bytes: int | None


@dataclass(frozen=True)
class ProfileOp:
    name: str
    calls: int | None
    self_cpu_us: float | None
    cpu_total_us: float | None
    self_device_us: float | None
    device_total_us: float | None
    self_mem_bytes: int | None


@dataclass(frozen=True)
class StackDumpRow:
    id: int
    run_id: str | None
    pid: int
    ts_ms: int
    reason: str
    stacks_json: str | None
    error: str | None

    @property
    def threads(self) -> list[Any] | None:
        return None if self.stacks_json is None else json.loads(self.stacks_json)


def profiles(conn: sqlite3.Connection, run_id: str, since_ms: int | None = None) -> list[Profile]:
    """A run's profiles, newest first."""
    return _build(
        Profile,
        conn.execute(
            f"SELECT {columns_of(Profile)} FROM profiles WHERE run_id = ? AND ts_ms >= ? "
            "ORDER BY ts_ms DESC, id DESC",
            (run_id, since_ms or 0),
        ),
    )


def profile_ops(conn: sqlite3.Connection, profile_id: int, limit: int = 50) -> list[ProfileOp]:
    """Top operators of a profile: by self device time, then self CPU time."""
    return _build(
        ProfileOp,
        conn.execute(
            f"SELECT {columns_of(ProfileOp)} FROM profile_ops WHERE profile_id = ? "
            "ORDER BY COALESCE(self_device_us, 0) DESC, COALESCE(self_cpu_us, 0) DESC LIMIT ?",
            (profile_id, limit),
        ),
    )


def profile_breakdown(conn: sqlite3.Connection, profile_id: int) -> dict[str, Any] | None:
    """A profile's trace analysis (one rank of `gpuwatch trace --format json`, with `advice`);
    None when the profile has none (no trace kept, or stored before the analysis existed)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'profile_breakdowns'").fetchone():
        return None
    row = conn.execute(
        "SELECT breakdown_json FROM profile_breakdowns WHERE profile_id = ?", (profile_id,)
    ).fetchone()
    return None if row is None else json.loads(row[0])


def latest_breakdown(conn: sqlite3.Connection, run_id: str) -> dict[str, Any] | None:
    """The breakdown of a run's newest profile that has one (show, compare and report)."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'profile_breakdowns'").fetchone():
        return None
    row = conn.execute(
        "SELECT b.breakdown_json FROM profile_breakdowns b JOIN profiles p ON "
        "p.id = b.profile_id WHERE p.run_id = ? ORDER BY p.ts_ms DESC, p.id DESC "
        "LIMIT 1",
        (run_id,),
    ).fetchone()
    return None if row is None else json.loads(row[0])


def stack_dumps(conn: sqlite3.Connection, run_id: str, limit: int = 10) -> list[StackDumpRow]:
    """A run's stack dumps, newest first."""
    return _build(
        StackDumpRow,
        conn.execute(
            f"SELECT {columns_of(StackDumpRow)} FROM stack_dumps WHERE run_id = ? "
            "ORDER BY ts_ms DESC, id DESC LIMIT ?",
            (run_id, limit),
        ),
    )


@dataclass(frozen=True)
class CapacityStudy:
    id: int
    ts_ms: int
    command: str
    device: str | None
    limit_bytes: int | None
    margin: float | None
    fit_json: str | None
    predicted_json: str | None

    def fitted_bytes(self, batch: int, seq_len: int) -> float | None:
        fit = json.loads(self.fit_json or "{}").get(str(batch))
        return None if fit is None else fit["a"] + fit["b"] * seq_len + fit["c"] * seq_len * seq_len

    @property
    def predicted(self) -> dict[int, dict[str, Any]]:
        return {int(b): p for b, p in json.loads(self.predicted_json or "{}").items()}


@dataclass(frozen=True)
class CapacityPoint:
    batch: int
    seq_len: int
    peak_bytes: int | None
    ok: int
    kind: str


def latest_capacity_study(conn: sqlite3.Connection) -> tuple[CapacityStudy, list[CapacityPoint]] | None:
    """The newest `gpuwatch capacity` study and its points (by batch, then length)."""
    found = _build(
        CapacityStudy,
        conn.execute(
            f"SELECT {columns_of(CapacityStudy)} FROM capacity_studies ORDER BY ts_ms DESC, id DESC LIMIT 1"
        ),
    )
    if not found:
        return None
    points = _build(
        CapacityPoint,
        conn.execute(
            f"SELECT {columns_of(CapacityPoint)} FROM capacity_points WHERE study_id = ? "
            "ORDER BY batch, seq_len, kind",
            (found[0].id,),
        ),
    )
    return found[0], points

"""Read side of profiles, their top operators and stack dumps (for the CLI and the TUI)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

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
    def threads(self) -> list | None:
        return None if self.stacks_json is None else json.loads(self.stacks_json)


def profiles(conn: sqlite3.Connection, run_id: str, since_ms: int | None = None) -> list[Profile]:
    """A run's profiles, newest first."""
    return _build(Profile, conn.execute(
        f"SELECT {columns_of(Profile)} FROM profiles WHERE run_id = ? AND ts_ms >= ? "
        "ORDER BY ts_ms DESC, id DESC", (run_id, since_ms or 0)))


def profile_ops(conn: sqlite3.Connection, profile_id: int, limit: int = 50) -> list[ProfileOp]:
    """Top operators of a profile: by self device time, then self CPU time."""
    return _build(ProfileOp, conn.execute(
        f"SELECT {columns_of(ProfileOp)} FROM profile_ops WHERE profile_id = ? "
        "ORDER BY COALESCE(self_device_us, 0) DESC, COALESCE(self_cpu_us, 0) DESC LIMIT ?",
        (profile_id, limit)))


def stack_dumps(conn: sqlite3.Connection, run_id: str, limit: int = 10) -> list[StackDumpRow]:
    """A run's stack dumps, newest first."""
    return _build(StackDumpRow, conn.execute(
        f"SELECT {columns_of(StackDumpRow)} FROM stack_dumps WHERE run_id = ? "
        "ORDER BY ts_ms DESC, id DESC LIMIT ?", (run_id, limit)))

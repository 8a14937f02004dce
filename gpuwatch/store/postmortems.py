"""Read side of the OOM postmortems: rows of `oom_postmortems` as dataclasses, JSON parsed."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Postmortem:
    id: int
    run_id: str
    ts_ms: int
    kind: str  # gpu | host
    device: int | None
    requested_bytes: int | None
    total_bytes: int | None
    free_bytes: int | None
    allocated_bytes: int | None
    reserved_bytes: int | None
    rss_bytes: int | None
    available_bytes: int | None
    cgroup_limit_bytes: int | None
    step: int | None
    seq_len: int | None
    batch: int | None
    phase: str | None
    error_message: str | None
    traceback: str | None
    memory_summary: str | None
    snapshot_path: str | None
    stats: dict[str, Any] = field(default_factory=dict)
    largest_blocks: list[Any] = field(default_factory=list)
    neighbours: list[Any] | None = None  # None: nobody could read NVML; [] = alone on the GPU
    advice: list[Any] = field(default_factory=list)


def headroom_bytes(pm: dict[str, Any]) -> int | None:
    """Memory the failed allocation could have had: free GPU memory, or the tightest host bound
    (available memory, cgroup limit less RSS, RLIMIT_AS less address space). `pm`: captured
    fields (oom_kind) or a stored row as a dict (kind)."""
    if pm.get("oom_kind", pm.get("kind")) == "gpu":
        return pm.get("free_bytes")
    rss = pm.get("rss_bytes") or 0
    stats = pm.get("stats") or {}
    bounds = [pm.get("available_bytes")]
    if pm.get("cgroup_limit_bytes"):
        bounds.append(max(pm["cgroup_limit_bytes"] - rss, 0))
    if stats.get("rlimit_as_bytes"):
        bounds.append(max(stats["rlimit_as_bytes"] - (stats.get("vms_bytes") or rss), 0))
    known: list[int] = [b for b in bounds if b is not None]
    return min(known) if known else None


_JSON = ("stats", "largest_blocks", "neighbours", "advice")
_PLAIN = [f.name for f in fields(Postmortem) if f.name not in _JSON]
_COLUMNS = _PLAIN + [f"{n}_json" for n in _JSON]
_SELECT = "SELECT " + ", ".join(_COLUMNS) + " FROM oom_postmortems"


def _parse(text: str | None, empty: Any) -> Any:
    if not text:
        return empty
    try:
        return json.loads(text)
    except ValueError:  # written by another tool: show the rest rather than fail
        return empty


def _build(row: tuple[Any, ...]) -> Postmortem:
    plain, parsed = row[: len(_PLAIN)], row[len(_PLAIN) :]
    stats, blocks, neighbours, advice = parsed
    return Postmortem(
        **dict(zip(_PLAIN, plain)),
        stats=_parse(stats, {}),
        largest_blocks=_parse(blocks, []),
        neighbours=_parse(neighbours, None),
        advice=_parse(advice, []),
    )


def for_run(conn: sqlite3.Connection, run_id: str) -> list[Postmortem]:
    """A run's postmortems, oldest first (ranks of one run may each have one)."""
    return [_build(r) for r in conn.execute(_SELECT + " WHERE run_id = ? ORDER BY ts_ms, id", (run_id,))]


def recent(conn: sqlite3.Connection, limit: int = 50) -> list[tuple[Postmortem, str | None, str | None]]:
    """The newest postmortems across all runs, newest first, with their run's name and user."""
    rows = conn.execute(
        "SELECT " + ", ".join("o." + c for c in _COLUMNS) + ", r.name, r.user FROM oom_postmortems o "
        "LEFT JOIN runs r ON r.run_id = o.run_id ORDER BY o.ts_ms DESC, o.id DESC LIMIT ?",
        (limit,),
    ).fetchall()
    return [(_build(r[:-2]), r[-2], r[-1]) for r in rows]

"""Alert events in the store: write one per incident, read them back as dataclasses.

The rules (gpuwatch/alerts) call `record` from a writer job; delivery and the readers (CLI,
TUI, /metrics) call `since` / `recent` on any connection. Subscriptions and their URLs are
not here: a URL is a secret and this database is readable by every user.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

_COLUMNS = (
    "ts_ms",
    "kind",
    "incident",
    "host",
    "uid",
    "run_id",
    "gpu_index",
    "pid",
    "title",
    "body",
    "detail_json",
)


@dataclass(frozen=True)
class Alert:
    kind: str
    incident: str
    ts_ms: int
    host: str
    title: str
    body: str
    uid: int | None = None
    run_id: str | None = None
    gpu_index: int | None = None
    pid: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    id: int | None = None  # set once stored


def record(conn: sqlite3.Connection, alert: Alert) -> int | None:
    """Store `alert` unless its (kind, incident) is stored already; its new id, or None for a
    repeat. Call it inside a writer job."""
    values = (
        alert.ts_ms,
        alert.kind,
        alert.incident,
        alert.host,
        alert.uid,
        alert.run_id,
        alert.gpu_index,
        alert.pid,
        alert.title,
        alert.body,
        json.dumps(alert.detail, sort_keys=True) if alert.detail else None,
    )
    cur = conn.execute(
        f"INSERT OR IGNORE INTO alerts ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})",
        values,
    )
    return cur.lastrowid if cur.rowcount else None


def _build(row: tuple[Any, ...]) -> Alert:
    (id_, ts_ms, kind, incident, host, uid, run_id, gpu_index, pid, title, body, detail) = row
    return Alert(
        kind=kind,
        incident=incident,
        ts_ms=ts_ms,
        host=host,
        title=title,
        body=body,
        uid=uid,
        run_id=run_id,
        gpu_index=gpu_index,
        pid=pid,
        detail=json.loads(detail) if detail else {},
        id=id_,
    )


_SELECT = f"SELECT id, {', '.join(_COLUMNS)} FROM alerts"


def since(conn: sqlite3.Connection, after_id: int = 0, limit: int = 1000) -> list[Alert]:
    """Alerts stored after `after_id`, oldest first: what a deliverer has not seen yet."""
    return [_build(r) for r in conn.execute(f"{_SELECT} WHERE id > ? ORDER BY id LIMIT ?", (after_id, limit))]


def recent(conn: sqlite3.Connection, limit: int = 100, uid: int | None = None) -> list[Alert]:
    """The newest alerts first, everyone's or one uid's (theirs and the host-wide ones)."""
    if uid is None:
        rows = conn.execute(f"{_SELECT} ORDER BY id DESC LIMIT ?", (limit,))
    else:
        rows = conn.execute(f"{_SELECT} WHERE uid = ? OR uid IS NULL ORDER BY id DESC LIMIT ?", (uid, limit))
    return [_build(r) for r in rows]


def by_ids(conn: sqlite3.Connection, ids: list[int]) -> list[Alert]:
    """The alerts with these ids (those still stored), oldest first."""
    out: list[Alert] = []
    for start in range(0, len(ids), 500):
        chunk = list(ids[start : start + 500])
        out += [
            _build(r)
            for r in conn.execute(f"{_SELECT} WHERE id IN ({','.join('?' * len(chunk))}) ORDER BY id", chunk)
        ]
    return out


def max_id(conn: sqlite3.Connection) -> int:
    """The newest alert's id; 0 when there is none."""
    newest: int = conn.execute("SELECT COALESCE(MAX(id), 0) FROM alerts").fetchone()[0]
    return newest


def any_for_run(conn: sqlite3.Connection, run_id: str, kinds: tuple[str, ...]) -> bool:
    """Whether an alert of one of these kinds is stored for the run."""
    marks = ",".join("?" * len(kinds))
    sql = f"SELECT 1 FROM alerts WHERE run_id = ? AND kind IN ({marks}) LIMIT 1"
    return conn.execute(sql, (run_id, *kinds)).fetchone() is not None


@dataclass(frozen=True)
class Recovery:
    """A run.stalled alert whose run stepped again since, with no run.recovered for it yet."""

    incident: str
    run_id: str
    stalled_ms: int  # the run's last step before the stall
    last_step_ms: int  # its newest step now
    name: str | None
    uid: int
    user: str | None


def recoveries(conn: sqlite3.Connection, host: str) -> list[Recovery]:
    """The host's stalled runs that stepped again and have no run.recovered alert yet."""
    return [
        Recovery(*row)
        for row in conn.execute(
            "SELECT a.incident, a.run_id, json_extract(a.detail_json, '$.last_step_ms'), r.last_step_ms, "
            "r.name, r.uid, r.user FROM alerts a JOIN runs r ON r.run_id = a.run_id "
            "WHERE a.kind = 'run.stalled' AND a.host = ? AND r.last_step_ms > json_extract(a.detail_json, "
            "'$.last_step_ms') AND NOT EXISTS (SELECT 1 FROM alerts b WHERE b.kind = 'run.recovered' "
            "AND b.incident = a.incident)",
            (host,),
        )
    ]

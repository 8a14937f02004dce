"""Apply validated client events to the database: the rules shared by daemon ingest and embedded mode.

Events arrive already checked by gpuwatch.protocol. Here they meet ownership and idempotency:
a run belongs to the uid that started it (taken from the socket, never the message); only that
uid may add to it; a re-sent event (same natural key) changes nothing, so a client can replay
its spool without counting anything twice. Called on the writer thread with its connection.
"""

from __future__ import annotations

import json
import socket
import sqlite3
from dataclasses import dataclass, field
from typing import Callable

from gpuwatch.store.writer import insert_rows


@dataclass(frozen=True)
class Peer:
    """Who sent the events: from SO_PEERCRED in the daemon, from the process itself when embedded."""

    uid: int
    user: str
    pid: int
    mode: str  # daemon | embedded


class EventRejected(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Outcome:
    applied: list[str] = field(default_factory=list)  # event ids now durable (once committed)
    rejected: list[tuple[str, str, str]] = field(default_factory=list)  # (id, code, message)

    def reply(self, warnings: list[str] = ()) -> dict:
        """The wire reply: `ack`, or an `error` naming the first refused event; `ids` are durable."""
        extra = {"warnings": list(warnings)[:20]} if warnings else {}
        if not self.rejected:
            return {"type": "ack", "ids": self.applied, **extra}
        event_id, code, message = self.rejected[0]
        more = f" (and {len(self.rejected) - 1} more)" if len(self.rejected) > 1 else ""
        return {"type": "error", "code": code, "error": f"event {event_id!r}: {message}{more}",
                "ids": self.applied, "rejected": [r[0] for r in self.rejected], **extra}


class _Batch:
    """State of one apply_events call: owners looked up once, rows inserted together."""

    def __init__(self, conn: sqlite3.Connection, peer: Peer):
        self.conn = conn
        self.peer = peer
        self.owners: dict[str, int | None] = {}
        self.rows: dict[tuple[str, str], list[dict]] = {}  # (table, conflict) -> rows
        self.last_step_ms: dict[str, int] = {}

    def owner(self, run_id: str) -> int | None:
        if run_id not in self.owners:
            found = self.conn.execute("SELECT uid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            self.owners[run_id] = found[0] if found else None
        return self.owners[run_id]

    def require_own(self, run_id: str) -> None:
        uid = self.owner(run_id)
        if uid is None:
            raise EventRejected("unknown_run", f"run {run_id!r} is unknown (its run_start never arrived)")
        if uid != self.peer.uid:
            raise EventRejected("forbidden", f"run {run_id!r} belongs to uid {uid}; "
                                             f"uid {self.peer.uid} may not write to it")

    def add_row(self, table: str, conflict: str, row: dict) -> None:
        self.rows.setdefault((table, conflict), []).append(row)

    def finish(self) -> None:
        for (table, conflict), rows in self.rows.items():
            insert_rows(self.conn, table, rows, conflict)
        for run_id, ts in self.last_step_ms.items():
            self.conn.execute("UPDATE runs SET last_step_ms = MAX(COALESCE(last_step_ms, 0), ?) "
                              "WHERE run_id = ?", (ts, run_id))


_ENVELOPE = frozenset({"id", "kind"})
_NO_RENAMES: dict[str, str] = {}


def _row(event: dict, renames: dict[str, str] = _NO_RENAMES) -> dict:
    """Event fields -> table columns: objects become <name>_json; envelope and nulls dropped."""
    row = {renames.get(k, k): v for k, v in event.items() if v is not None and k not in _ENVELOPE}
    for name in [k for k, v in row.items() if type(v) is dict]:
        row[name + "_json"] = json.dumps(row.pop(name), separators=(",", ":"))
    return row


def _run_start(batch: _Batch, event: dict) -> None:
    run_id = event["run_id"]
    uid = batch.owner(run_id)
    if uid is not None:
        if uid != batch.peer.uid:
            raise EventRejected("forbidden", f"run {run_id!r} already exists and belongs to uid {uid}")
        return  # a replayed run_start: the run is already there
    row = _row(event, {"ts_ms": "started_ms"})
    row.update(uid=batch.peer.uid, user=batch.peer.user, pid=batch.peer.pid, status="running",
               mode=batch.peer.mode)
    row.setdefault("host", socket.gethostname())
    insert_rows(batch.conn, "runs", [row])
    batch.owners[run_id] = batch.peer.uid
    # The newest process row for the sender's pid now belongs to this run (GPU memory per run).
    batch.conn.execute(
        "UPDATE processes SET run_id = ? WHERE pid = ? AND run_id IS NULL AND "
        "start_ms = (SELECT MAX(start_ms) FROM processes WHERE pid = ?)",
        (run_id, batch.peer.pid, batch.peer.pid))


def _run_end(batch: _Batch, event: dict) -> None:
    batch.require_own(event["run_id"])
    # Overwrites 'lost' too: a client that was away and comes back knows better.
    batch.conn.execute(
        "UPDATE runs SET status = ?, exit_code = ?, signal = ?, error_type = ?, error_message = ?, "
        "ended_ms = ? WHERE run_id = ?",
        (event["status"], event.get("exit_code"), event.get("signal"), event.get("error_type"),
         event.get("error_message"), event["ts_ms"], event["run_id"]))


def table_applier(table: str, renames: dict[str, str] = _NO_RENAMES) -> Callable[[_Batch, dict], None]:
    """Events that become one row of a run's table, idempotent by the table's natural key."""

    def apply(batch: _Batch, event: dict) -> None:
        batch.require_own(event["run_id"])
        batch.add_row(table, "IGNORE", _row(event, renames))

    return apply


_insert_step = table_applier("steps")


def _step(batch: _Batch, event: dict) -> None:
    _insert_step(batch, event)
    run_id = event["run_id"]
    batch.last_step_ms[run_id] = max(batch.last_step_ms.get(run_id, 0), event["ts_ms"])


# kind -> applier; protocol.EVENT_KINDS says which fields each kind may carry.
APPLIERS: dict[str, Callable[[_Batch, dict], None]] = {
    "run_start": _run_start,
    "run_end": _run_end,
    "step": _step,
    "generation": table_applier("generations"),
    "memory_stats": table_applier("memory_stats"),
    "run_event": table_applier("run_events", {"event_kind": "kind"}),
}


def apply_events(conn: sqlite3.Connection, events: list[dict], peer: Peer) -> Outcome:
    """Apply validated events in order; refused ones are reported, the rest applied."""
    batch = _Batch(conn, peer)
    outcome = Outcome()
    for event in events:
        try:
            APPLIERS[event["kind"]](batch, event)
        except EventRejected as e:
            outcome.rejected.append((event["id"], e.code, str(e)))
        else:
            outcome.applied.append(event["id"])
    batch.finish()
    return outcome

"""Apply validated client events to the database: the rules shared by daemon ingest and embedded mode.

Events arrive already checked by gpuwatch.protocol. Here they meet ownership and idempotency:
a run belongs to the uid that started it (taken from the socket, never the message); only that
uid may add to it; a re-sent event (same natural key) changes nothing, so a client can replay
its spool without counting anything twice. Called on the writer thread with its connection.
"""

from __future__ import annotations

import json
import re
import socket
import sqlite3
from dataclasses import dataclass, field
from itertools import chain, groupby, repeat
from operator import itemgetter
from typing import Any, Callable, Sequence

from gpuwatch.store.writer import insert_rows, insert_sql


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

    def reply(self, warnings: Sequence[str] = ()) -> dict[str, Any]:
        """The wire reply: `ack`, or an `error` naming the first refused event; `ids` are durable."""
        extra = {"warnings": list(warnings)[:20]} if warnings else {}
        if not self.rejected:
            return {"type": "ack", "ids": self.applied, **extra}
        event_id, code, message = self.rejected[0]
        more = f" (and {len(self.rejected) - 1} more)" if len(self.rejected) > 1 else ""
        return {
            "type": "error",
            "code": code,
            "error": f"event {event_id!r}: {message}{more}",
            "ids": self.applied,
            "rejected": [r[0] for r in self.rejected],
            **extra,
        }


class _Batch:
    """State of one apply_events call: owners looked up once, rows inserted together."""

    def __init__(self, conn: sqlite3.Connection, peer: Peer):
        self.conn = conn
        self.peer = peer
        self.owners: dict[str, int | None] = {}
        # (table, conflict, columns) -> rows, each one executemany
        self.rows: dict[tuple[str, str, tuple[str, ...]], list[tuple[Any, ...]]] = {}
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
            raise EventRejected(
                "forbidden", f"run {run_id!r} belongs to uid {uid}; uid {self.peer.uid} may not write to it"
            )

    def add_row(self, table: str, conflict: str, row: dict[str, Any]) -> None:
        self.rows.setdefault((table, conflict, tuple(row)), []).append(tuple(row.values()))

    def add_rows(
        self, table: str, conflict: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
    ) -> None:
        self.rows.setdefault((table, conflict, columns), []).extend(rows)

    def note_step(self, run_id: str, ts_ms: int) -> None:
        self.last_step_ms[run_id] = max(self.last_step_ms.get(run_id, 0), ts_ms)

    def finish(self) -> None:
        for (table, conflict, columns), rows in self.rows.items():
            self.conn.executemany(insert_sql(table, columns, conflict), rows)
        for run_id, ts in self.last_step_ms.items():
            self.conn.execute(
                "UPDATE runs SET last_step_ms = MAX(COALESCE(last_step_ms, 0), ?) WHERE run_id = ?",
                (ts, run_id),
            )


_ENVELOPE = frozenset({"id", "kind"})
_NO_RENAMES: dict[str, str] = {}


def _row(event: dict[str, Any], renames: dict[str, str] = _NO_RENAMES) -> dict[str, Any]:
    """Event fields -> table columns: objects become <name>_json; envelope and nulls dropped."""
    row = {renames.get(k, k): v for k, v in event.items() if v is not None and k not in _ENVELOPE}
    for name in [k for k, v in row.items() if type(v) is dict]:
        row[name + "_json"] = json.dumps(row.pop(name), separators=(",", ":"))
    return row


def _run_start(batch: _Batch, event: dict[str, Any]) -> None:
    run_id = event["run_id"]
    uid = batch.owner(run_id)
    if uid is not None:
        if uid != batch.peer.uid:
            raise EventRejected("forbidden", f"run {run_id!r} already exists and belongs to uid {uid}")
        return  # a replayed run_start: the run is already there
    row = _row(event, {"ts_ms": "started_ms"})
    row.update(
        uid=batch.peer.uid, user=batch.peer.user, pid=batch.peer.pid, status="running", mode=batch.peer.mode
    )
    row.setdefault("host", socket.gethostname())
    insert_rows(batch.conn, "runs", [row])
    batch.owners[run_id] = batch.peer.uid
    # The newest process row for the sender's pid now belongs to this run (GPU memory per run).
    batch.conn.execute(
        "UPDATE processes SET run_id = ? WHERE pid = ? AND run_id IS NULL AND "
        "start_ms = (SELECT MAX(start_ms) FROM processes WHERE pid = ?)",
        (run_id, batch.peer.pid, batch.peer.pid),
    )


def _run_end(batch: _Batch, event: dict[str, Any]) -> None:
    batch.require_own(event["run_id"])
    # Overwrites 'lost' too: a client that was away and comes back knows better.
    batch.conn.execute(
        "UPDATE runs SET status = ?, exit_code = ?, signal = ?, error_type = ?, error_message = ?, "
        "ended_ms = ? WHERE run_id = ?",
        (
            event["status"],
            event.get("exit_code"),
            event.get("signal"),
            event.get("error_type"),
            event.get("error_message"),
            event["ts_ms"],
            event["run_id"],
        ),
    )


_get_id, _get_kind, _get_run_id, _get_ts = (itemgetter(k) for k in ("id", "kind", "run_id", "ts_ms"))
_NONE_TYPE = type(None)
_RESHAPING_TYPES = (_NONE_TYPE, dict)  # a null or an object in a column: rows need more than a copy
_columns_with_default: dict[str, frozenset[str]] = {}


def _defaulted(conn: sqlite3.Connection, table: str) -> frozenset[str]:
    """Columns of `table` with a DEFAULT: for them a null must be left out, not inserted."""
    if table not in _columns_with_default:
        info = conn.execute(f"PRAGMA table_info({table})").fetchall()
        _columns_with_default[table] = frozenset(c[1] for c in info if c[4] is not None)
    return _columns_with_default[table]


class TableApplier:
    """Events that become one row of a run's table, idempotent by the table's natural key.

    It takes a run of consecutive events of its kind at once and builds the executemany rows a
    column at a time: the daemon's hot path is a batch of steps."""

    def __init__(self, table: str, renames: dict[str, str] = _NO_RENAMES, *, tracks_steps: bool = False):
        self.table = table
        self.renames = renames
        self.tracks_steps = tracks_steps  # keeps runs.last_step_ms current

    def apply_many(self, batch: _Batch, events: list[dict[str, Any]], outcome: Outcome) -> None:
        run_ids = list(map(_get_run_id, events))
        refused: dict[str, EventRejected] = {}
        for run_id in set(run_ids):
            try:
                batch.require_own(run_id)
            except EventRejected as e:
                refused[run_id] = e
        if refused:
            for event, run_id in zip(events, run_ids):
                if run_id in refused:
                    outcome.rejected.append((event["id"], refused[run_id].code, str(refused[run_id])))
            events = [e for e, run_id in zip(events, run_ids) if run_id not in refused]
            run_ids = [run_id for run_id in run_ids if run_id not in refused]
            if not events:
                return
        outcome.applied.extend(map(_get_id, events))
        self._add_rows(batch, events)
        if self.tracks_steps:
            if len(set(run_ids)) == 1:
                batch.note_step(run_ids[0], max(map(_get_ts, events)))
            else:
                for run_id, ts in zip(run_ids, map(_get_ts, events)):
                    batch.note_step(run_id, ts)

    def _add_rows(self, batch: _Batch, events: list[dict[str, Any]]) -> None:
        """The same rows as _row gives, built column-wise: all-null columns are left out."""
        fields = [name for name in events[0] if name not in _ENVELOPE]
        rows = None
        if len(fields) > 1 and set(map(len, events)) == {len(events[0])}:
            try:  # as many fields as the first, and the same ones: every event has every field
                rows = list(map(itemgetter(*fields), events))
            except KeyError:
                pass
        if rows is None:
            fields = sorted(set().union(*events) - _ENVELOPE)
            rows = list(zip(*(map(dict.get, events, repeat(name)) for name in fields)))
        if set(map(type, chain.from_iterable(rows))).isdisjoint(_RESHAPING_TYPES):
            batch.add_rows(self.table, "IGNORE", tuple(self.renames.get(n, n) for n in fields), rows)
            return
        columns: list[str] = []
        values: list[Any] = []
        nullable: list[str] = []  # columns null in some rows only
        column: Sequence[Any]
        for name, column in zip(fields, zip(*rows)):
            types = set(map(type, column))
            if _NONE_TYPE in types and len(types) == 1:
                continue
            name = self.renames.get(name, name)
            if dict in types:
                column = [json.dumps(v, separators=(",", ":")) if type(v) is dict else v for v in column]
                name += "_json"
            if _NONE_TYPE in types:
                nullable.append(name)
            columns.append(name)
            values.append(column)
        if not _defaulted(batch.conn, self.table).isdisjoint(nullable):
            for event in events:  # a null there means "take the default": rows differ in columns
                batch.add_row(self.table, "IGNORE", _row(event, self.renames))
            return
        batch.add_rows(self.table, "IGNORE", tuple(columns), list(zip(*values)))


class RunEventApplier(TableApplier):
    """run_events rows. An `attached` event (a `gpuwatch run` child's: its hooks' or track()'s
    config) also gives its run the config the wrapper's run_start could not: runs.config_json,
    what SQL, search and every view read, is then there however the run started."""

    def apply_many(self, batch: _Batch, events: list[dict[str, Any]], outcome: Outcome) -> None:
        super().apply_many(batch, events, outcome)
        for event in events:
            payload = event.get("payload") if event.get("event_kind") == "attached" else None
            config = payload.get("config") if payload else None
            if config and type(config) is dict and batch.owner(event["run_id"]) == batch.peer.uid:
                batch.conn.execute(
                    "UPDATE runs SET config_json = ? WHERE run_id = ? AND config_json IS NULL",
                    (json.dumps(config, separators=(",", ":")), event["run_id"]),
                )


NEIGHBOUR_SAMPLE_MAX_AGE_MS = 60_000  # older GPU process samples say nothing about the OOM moment


_LEGACY_MIG_UUID = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")  # MIG-GPU-<uuid>/GI/CI


def _gpu_index_of(conn: sqlite3.Connection, run_id: str, device: int) -> tuple[int, tuple[int, int] | None]:
    """NVML index of the run's CUDA device `device`, through the run's visible GPU UUIDs if known,
    and (GPU instance, compute instance) when that device is a MIG device."""
    found = conn.execute("SELECT gpu_uuids FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    uuids = [u.strip() for u in (found[0] or "").split(",") if u.strip()] if found else []
    if device < len(uuids):
        uuid, mig = uuids[device], None
        legacy = _LEGACY_MIG_UUID.match(uuid)
        if legacy:
            uuid, mig = legacy[1], (int(legacy[2]), int(legacy[3]))
        row = conn.execute("SELECT gpu_index FROM gpus WHERE uuid = ?", (uuid,)).fetchone()
        if row:
            return row[0], mig
        row = conn.execute(
            "SELECT gpu_index, gpu_instance_id, compute_instance_id FROM mig_devices WHERE uuid = ?", (uuid,)
        ).fetchone()
        if row:
            return row[0], (row[1], row[2])
        if uuid.isdigit():
            return int(uuid), None
    return device, None


def _neighbours_from_samples(
    conn: sqlite3.Connection, run_id: str, device: int, own_pid: int, ts_ms: int
) -> list[dict[str, Any]] | None:
    """Other processes on the OOM's GPU (on a MIG device: on that MIG device, whose memory is
    its own) at the daemon's newest process sample before the OOM."""
    gpu, mig = _gpu_index_of(conn, run_id, device)
    newest = conn.execute(
        "SELECT MAX(ts_ms) FROM gpu_process_samples WHERE gpu_index = ? AND ts_ms < ?", (gpu, ts_ms + 1001)
    ).fetchone()[0]
    if newest is None or newest < ts_ms - NEIGHBOUR_SAMPLE_MAX_AGE_MS:
        return None
    on_mig = "AND s.gpu_instance_id = ? AND s.compute_instance_id = ? " if mig else ""
    rows = conn.execute(
        f"SELECT s.pid, p.user, s.used_mem_bytes, p.run_id FROM gpu_process_samples s "
        "LEFT JOIN processes p ON p.pid = s.pid AND p.start_ms = "
        "(SELECT MAX(start_ms) FROM processes WHERE pid = s.pid) "
        f"WHERE s.gpu_index = ? AND s.ts_ms = ? AND s.pid != ? {on_mig}ORDER BY s.used_mem_bytes DESC",
        (gpu, newest, own_pid, *(mig or ())),
    ).fetchall()
    return [
        {"pid": pid, "user": user, "used_mem_bytes": used, "run_id": run} for pid, user, used, run in rows
    ]


def _oom_postmortem(batch: _Batch, event: dict[str, Any]) -> None:
    run_id, ts = event["run_id"], event["ts_ms"]
    batch.require_own(run_id)
    # The table has no natural key: a replayed postmortem is recognised by its run and time.
    if batch.conn.execute(
        "SELECT 1 FROM oom_postmortems WHERE run_id = ? AND ts_ms = ?", (run_id, ts)
    ).fetchone():
        return
    row = _row(event, {"oom_kind": "kind"})
    for neighbour in row.get("neighbours") or []:
        if (
            neighbour.get("run_id") is None
            and type(neighbour.get("pid")) is int
            and 0 < neighbour["pid"] < 2**31
        ):
            # The client saw the pid in NVML; which run it belongs to only the store knows.
            known = batch.conn.execute(
                "SELECT run_id FROM processes WHERE pid = ? ORDER BY start_ms DESC LIMIT 1",
                (neighbour["pid"],),
            ).fetchone()
            neighbour["run_id"] = known[0] if known else None
    for name in ("largest_blocks", "neighbours", "advice"):
        if name in row:
            row[name + "_json"] = json.dumps(row.pop(name), separators=(",", ":"))
    if row["kind"] == "gpu" and "neighbours_json" not in row and "device" in row:
        # The client could not read NVML: the daemon's own samples say who else was there.
        found = _neighbours_from_samples(batch.conn, run_id, row["device"], batch.peer.pid, ts)
        if found is not None:
            row["neighbours_json"] = json.dumps(found, separators=(",", ":"))
    insert_rows(batch.conn, "oom_postmortems", [row])


_INT64 = (-(2**63), 2**63 - 1)
_OP_COLUMNS = {
    "calls": int,
    "self_cpu_us": float,
    "cpu_total_us": float,
    "self_device_us": float,
    "device_total_us": float,
    "self_mem_bytes": int,
}


def _profile_op(op: dict[str, Any]) -> dict[str, Any]:
    name = op.get("name")
    if type(name) is not str or not 0 < len(name) <= 1024:
        raise EventRejected(
            "invalid", f"profile op name: expected a string of 1-1024 characters, got {name!r:.40}"
        )
    row = {"name": name}
    for column, kind in _OP_COLUMNS.items():
        value = op.get(column)
        if value is not None:
            # In range before converting: int(nan) and float(10**400) raise, SQLite holds 64 bits.
            if type(value) not in (int, float) or not _INT64[0] <= value <= _INT64[1]:
                raise EventRejected(
                    "invalid", f"profile op {name!r:.40}.{column}: expected a finite number within 64 bits"
                )
            row[column] = kind(value)
    return row


_BREAKDOWN_MAX_BYTES = 1 << 20
# profile_breakdowns column -> (section of the breakdown, key in it)
_BREAKDOWN_COLUMNS = {
    "kernel_time_us": ("temporal", "kernel_time_us"),
    "idle_pct": ("temporal", "idle_pct"),
    "compute_pct": ("temporal", "compute_pct"),
    "non_compute_pct": ("temporal", "non_compute_pct"),
    "idle_host_wait_pct": ("idle", "host_wait_pct"),
    "idle_dataloader_pct": ("idle", "dataloader_pct"),
    "idle_sync_pct": ("idle", "sync_pct"),
    "idle_other_pct": ("idle", "other_pct"),
    "overlap_pct": (None, "overlap_pct"),
    "cpu_operators_pct": ("cpu", "operators_pct"),
    "cpu_dataloader_pct": ("cpu", "dataloader_pct"),
    "cpu_optimizer_pct": ("cpu", "optimizer_pct"),
    "cpu_other_pct": ("cpu", "other_pct"),
}


def _breakdown_row(bd: dict[str, Any]) -> dict[str, Any]:
    """A `profile_breakdowns` row from a profile event's `breakdown` (client data: checked)."""
    row: dict[str, Any] = {"gpu": 1 if bd.get("gpu") else 0}
    for column, (section, key) in _BREAKDOWN_COLUMNS.items():
        part = bd if section is None else bd.get(section)
        value = part.get(key) if isinstance(part, dict) else None
        if value is not None:
            if type(value) not in (int, float) or not _INT64[0] <= value <= _INT64[1]:
                raise EventRejected("invalid", f"breakdown {column}: expected a finite number")
            row[column] = float(value)
    advice = bd.get("advice")
    if advice is not None:
        if not isinstance(advice, list) or not all(type(a) is str for a in advice):
            raise EventRejected("invalid", "breakdown advice: expected a list of strings")
        row["advice_json"] = json.dumps(advice)
    row["breakdown_json"] = json.dumps(bd, separators=(",", ":"))
    if len(row["breakdown_json"]) > _BREAKDOWN_MAX_BYTES:
        raise EventRejected("invalid", f"breakdown: over {_BREAKDOWN_MAX_BYTES} bytes of JSON")
    return row


def _profile(batch: _Batch, event: dict[str, Any]) -> None:
    """A `profiles` row and its `profile_ops`; a replayed event (same run, time, rank, trigger)
    changes nothing."""
    batch.require_own(event["run_id"])
    ops = [_profile_op(op) for op in event.get("ops") or ()]
    breakdown = _breakdown_row(event["breakdown"]) if event.get("breakdown") else None
    key = (event["run_id"], event["ts_ms"], event.get("rank"), event["trigger"])
    if batch.conn.execute(
        "SELECT 1 FROM profiles WHERE run_id = ? AND ts_ms = ? AND rank IS ? AND trigger = ?", key
    ).fetchone():
        return
    row = {
        k: event.get(k)
        for k in ("run_id", "ts_ms", "rank", "trigger", "first_step", "steps", "trace_path", "trace_bytes")
    }
    cur = batch.conn.execute(
        "INSERT INTO profiles (run_id, ts_ms, rank, trigger, first_step, steps, trace_path, trace_bytes) "
        "VALUES (:run_id, :ts_ms, :rank, :trigger, :first_step, :steps, :trace_path, :trace_bytes)",
        row,
    )
    for op in ops:
        op["profile_id"] = cur.lastrowid
    insert_rows(batch.conn, "profile_ops", ops, "IGNORE")
    if breakdown:
        insert_rows(batch.conn, "profile_breakdowns", [{"profile_id": cur.lastrowid, **breakdown}])


def _note(batch: _Batch, event: dict[str, Any]) -> None:
    """A note by the run's owner, or by root (who may annotate anyone's run)."""
    if batch.peer.uid != 0 or batch.owner(event["run_id"]) is None:
        batch.require_own(event["run_id"])
    batch.add_row(
        "run_notes",
        "IGNORE",
        {
            "run_id": event["run_id"],
            "ts_ms": event["ts_ms"],
            "uid": batch.peer.uid,
            "user": batch.peer.user,
            "text": event["text"],
        },
    )


# kind -> applier; protocol.EVENT_KINDS says which fields each kind may carry.
APPLIERS: dict[str, Callable[[_Batch, dict[str, Any]], None] | TableApplier] = {
    "run_start": _run_start,
    "run_end": _run_end,
    "step": TableApplier("steps", tracks_steps=True),
    "generation": TableApplier("generations"),
    "memory_stats": TableApplier("memory_stats"),
    "run_event": RunEventApplier("run_events", {"event_kind": "kind"}),
    "profile": _profile,
    "oom_postmortem": _oom_postmortem,
    "note": _note,
}


def apply_events(conn: sqlite3.Connection, events: list[dict[str, Any]], peer: Peer) -> Outcome:
    """Apply validated events in order; refused ones are reported, the rest applied."""
    batch = _Batch(conn, peer)
    outcome = Outcome()
    start = 0
    for kind, same in groupby(map(_get_kind, events)):
        end = start + len(list(same))
        applier = APPLIERS[kind]
        if isinstance(applier, TableApplier):
            applier.apply_many(batch, events[start:end], outcome)
        else:
            for event in events[start:end]:
                try:
                    applier(batch, event)
                except EventRejected as e:
                    outcome.rejected.append((event["id"], e.code, str(e)))
                else:
                    outcome.applied.append(event["id"])
        start = end
    batch.finish()
    return outcome


def apply_events_committed(conn: sqlite3.Connection, events: list[dict[str, Any]], peer: Peer) -> Outcome:
    """apply_events in a transaction of its own, for a writer outside the single writer (the
    spool replay's process): committed whole, or rolled back whole and raised as StoreError."""
    from gpuwatch.store.db import StoreError

    try:
        conn.execute("BEGIN IMMEDIATE")
        outcome = apply_events(conn, events, peer)
        conn.execute("COMMIT")
    except sqlite3.Error as e:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise StoreError(str(e)) from e
    return outcome

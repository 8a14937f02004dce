"""The sampler's writes: collector records into their tables, and the rows that describe the
GPUs, MIG devices and GPU processes seen (upserted, so a row keeps its first sighting).

Every function takes the writer's connection (the sampler hands them to the writer as jobs).
A record is any dataclass whose field names are its table's column names (the collectors'
records are); a dict row names its columns by its keys.
"""

from __future__ import annotations

import dataclasses
import operator
import sqlite3
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

from gpuwatch.store.writer import insert_sql

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_UPSERT_GPU = """
INSERT INTO gpus ({cols}) VALUES ({marks})
ON CONFLICT(gpu_index) DO UPDATE SET
  first_seen_ms = CASE WHEN gpus.uuid = excluded.uuid THEN gpus.first_seen_ms
                       ELSE excluded.first_seen_ms END,
  {updates}
"""

_UPSERT_MIG = """
INSERT INTO mig_devices ({cols}) VALUES ({marks})
ON CONFLICT(gpu_index, gpu_instance_id, compute_instance_id) DO UPDATE SET
  first_seen_ms = CASE WHEN mig_devices.uuid = excluded.uuid THEN mig_devices.first_seen_ms
                       ELSE excluded.first_seen_ms END,
  {updates}
"""

# Keep the first sighting; a run link found now wins, else keep one set earlier (e.g. by ingest).
_UPSERT_PROCESS = """
INSERT INTO processes ({cols}) VALUES ({marks})
ON CONFLICT(pid, start_ms) DO UPDATE SET
  last_seen_ms = excluded.last_seen_ms,
  run_id = COALESCE(excluded.run_id, processes.run_id)
"""

_PROCESS_SAMPLE_COLUMNS = (
    "gpu_index",
    "pid",
    "ts_ms",
    "kind",
    "used_mem_bytes",
    "sm_util_pct",
    "mem_util_pct",
    "rss_bytes",
    "cpu_pct",
    "gpu_instance_id",
    "compute_instance_id",
)
_PROCESS_SAMPLE = operator.attrgetter(*_PROCESS_SAMPLE_COLUMNS)


class TopProcess(NamedTuple):
    """One of the host's busiest processes at a process tick: a row of host_top_processes."""

    ts_ms: int
    pid: int
    start_ms: int
    uid: int | None
    user: str | None
    cmdline: str | None
    cpu_pct: float
    rss_bytes: int


_Columns = tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]
_COLUMNS: dict[type, _Columns] = {}
_SQL: dict[tuple[str, type], str] = {}


def _columns(record: DataclassInstance) -> _Columns:
    """A record type's field names, and a getter returning its values as a tuple."""
    found = _COLUMNS.get(type(record))
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(record))
        getter = operator.attrgetter(*names)
        found = _COLUMNS[type(record)] = (names, (getter if len(names) > 1 else lambda r: (getter(r),)))
    return found


def insert_records(
    conn: sqlite3.Connection, table: str, records: Sequence[DataclassInstance], keep_on_clash: bool = False
) -> None:
    """Insert records of one type, at least one, as tuples (asdict is too slow a tick); a row
    whose key is taken already is ignored.

    keep_on_clash (tables keyed by key and ts_ms, one row per key a tick): a row whose key and
    ts_ms are taken by another sample (the wall clock stepped back onto an earlier sample's very
    millisecond, which at a steady tick phase is every tick for the hour after) goes in at the
    next free millisecond instead of being ignored."""
    names, values_of = _columns(records[0])
    sql = _SQL.get((table, type(records[0])))
    if sql is None:
        sql = _SQL[(table, type(records[0]))] = insert_sql(table, names, "IGNORE")
    values = [values_of(r) for r in records]
    before = conn.total_changes
    conn.executemany(sql, values)
    if not keep_on_clash or conn.total_changes - before == len(values):
        return
    ts_at = names.index("ts_ms")
    same = f"SELECT 1 FROM {table} WHERE " + " AND ".join(f"{n} IS ?" for n in names)
    for value in values:  # rare: find the rows that were ignored
        row = list(value)
        while conn.execute(same, row).fetchone() is None and conn.execute(sql, row).rowcount == 0:
            row[ts_at] += 1


def insert_process_samples(conn: sqlite3.Connection, ts_ms: int, samples: Sequence[Any]) -> None:
    """One tick of gpu_process_samples (`samples`: the collector's process samples stamped
    ts_ms, with their utilisation, RSS and CPU % filled in). `kind` is stored NULL for
    'compute', the usual case. A GPU whose rows at ts_ms are taken by an earlier tick (the
    wall clock stepped back onto its very millisecond) has this tick's rows moved together to
    its next free millisecond: its processes stay one tick, and none is dropped."""
    values = []
    for sample in samples:
        row = _PROCESS_SAMPLE(sample)
        values.append((*row[:3], None, *row[4:]) if row[3] == "compute" else row)
    taken = "SELECT 1 FROM gpu_process_samples WHERE gpu_index = ? AND ts_ms = ? LIMIT 1"
    moved = {}
    for gpu in {v[0] for v in values}:
        at = ts_ms
        while conn.execute(taken, (gpu, at)).fetchone() is not None:
            at += 1
        moved[gpu] = at
    conn.executemany(
        insert_sql("gpu_process_samples", _PROCESS_SAMPLE_COLUMNS, "IGNORE"),
        [v if moved[v[0]] == ts_ms else (v[0], v[1], moved[v[0]], *v[3:]) for v in values],
    )


def insert_top_processes(conn: sqlite3.Connection, rows: Sequence[TopProcess]) -> None:
    """host_top_processes rows of one process tick (one per pid and tick: a repeat is ignored)."""
    conn.executemany(insert_sql("host_top_processes", TopProcess._fields, "IGNORE"), rows)


def upsert_gpus(conn: sqlite3.Connection, rows: Sequence[Mapping[str, object]]) -> None:
    """`gpus` rows, by gpu_index: a GPU whose uuid changed (another card in that slot) starts
    its first sighting again."""
    _upsert(conn, _UPSERT_GPU, rows, keep={"gpu_index", "first_seen_ms"})


def upsert_mig_devices(conn: sqlite3.Connection, rows: Sequence[Mapping[str, object]]) -> None:
    """`mig_devices` rows, by GPU, GPU instance and compute instance, as upsert_gpus."""
    _upsert(
        conn, _UPSERT_MIG, rows, keep={"gpu_index", "gpu_instance_id", "compute_instance_id", "first_seen_ms"}
    )


def upsert_processes(conn: sqlite3.Connection, rows: Sequence[Mapping[str, object]]) -> None:
    """`processes` rows, by (pid, start_ms): the first sighting stays, last_seen_ms moves on,
    and a run link found now wins (else one set earlier is kept)."""
    _upsert(conn, _UPSERT_PROCESS, rows, keep=set())


def _upsert(
    conn: sqlite3.Connection, template: str, rows: Sequence[Mapping[str, object]], keep: set[str]
) -> None:
    """Rows sharing one column set (the first row's), through one upsert statement."""
    columns = list(rows[0])
    updates = ",\n  ".join(f"{c} = excluded.{c}" for c in columns if c not in keep)
    sql = template.format(cols=", ".join(columns), marks=", ".join("?" * len(columns)), updates=updates)
    conn.executemany(sql, [tuple(r[c] for c in columns) for r in rows])

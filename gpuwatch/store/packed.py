"""Raw samples packed per key and time bucket, read back through views with the old names.

A sample row costs SQLite a header byte per column, a 6-byte timestamp and a few bytes of
cell bookkeeping whatever its values, so the raw tier stores each table twice over:
- `<name>_recent`: plain rows, as the sampler writes them. The newest KEEP_PLAIN_MS of every
  table always stay here, so the TUI and /metrics read their newest values with one seek.
- `<name>_packed`: one row per key and bucket (a minute of a GPU, ten minutes of a GPU
  process), written by maintenance once the bucket is older than that and rolled up.

`<name>` itself is a VIEW over both, with the original columns in the original order, so
any SQLite tool (and every query in the README) reads the same values as before; INSTEAD OF
INSERT triggers send rows written to the view into `<name>_recent`.

How a packed bucket holds a column (the sample times too, as `t`: ms after the bucket's start).
Sample k (0 = oldest) of a numeric column is

    value = c_b + c_s * k + c_g * digits_k          (REAL columns: that * 1.0 / c_d)

where `c` is a TEXT of n fixed-width decimal `digits_k` ('x' repeated = NULL), or NULL when
every digits_k is 0. c_s (a slope: the counters, the timestamps) and c_g (a common step, e.g.
15 MHz clocks) are chosen per bucket, so a constant column costs a few bytes a bucket and a
varying one its few significant digits. A REAL is stored as an integer over c_d = 10^e, for
the smallest e that gives back exactly the same double. TEXT columns are JSON arrays. The
encoding is exact: a bucket that cannot be encoded exactly stays in `_recent`.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass
from itertools import groupby

# Plain rows newer than this (before a table's newest sample) are never packed.
KEEP_PLAIN_MS = 10 * 60_000
SLOTS = 4096  # most samples a bucket may hold: rows of sample_slots, which number them
# Span of plain rows packed per table and call: a backlog (a day of 8 GPUs after an upgrade)
# is packed over many minutes instead of holding the writer for many seconds at once.
PACK_SPAN_MS = 3_600_000
_MAX_DECIMALS = 12  # load averages are multiples of 1/2048: 11 decimals
_MAX_ABS = 2**53  # keeps every sum in the decoder exact in SQLite's 64-bit integers
_NULL_DIGIT = "x"


@dataclass(frozen=True)
class SampleTable:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, INTEGER | REAL | TEXT) in the table's order
    pk: tuple[str, ...]                   # the plain table's primary key
    bucket_ms: int

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(c for c in self.pk if c != "ts_ms")

    @property
    def values(self) -> tuple[tuple[str, str], ...]:
        return tuple((c, kind) for c, kind in self.columns if c != "ts_ms" and c not in self.pk)

    @property
    def recent(self) -> str:
        return f"{self.name}_recent"

    @property
    def packed(self) -> str:
        return f"{self.name}_packed"


def _cols(text: str) -> tuple[tuple[str, str], ...]:
    return tuple(tuple(c.split()) for c in text.split(","))  # type: ignore[misc]


GPU_SAMPLES = SampleTable("gpu_samples", _cols(
    "gpu_index INTEGER, ts_ms INTEGER, gpu_util_pct INTEGER, mem_util_pct INTEGER, "
    "mem_used_bytes INTEGER, mem_free_bytes INTEGER, mem_reserved_bytes INTEGER, temp_c INTEGER, "
    "power_mw INTEGER, energy_mj INTEGER, sm_clock_mhz INTEGER, mem_clock_mhz INTEGER, "
    "pcie_tx_kbps INTEGER, pcie_rx_kbps INTEGER, fan_pct INTEGER, pstate INTEGER, "
    "throttle_reasons INTEGER, ecc_corrected INTEGER, ecc_uncorrected INTEGER, state TEXT"),
    ("gpu_index", "ts_ms"), 60_000)
GPU_PROCESS_SAMPLES = SampleTable("gpu_process_samples", _cols(
    "gpu_index INTEGER, pid INTEGER, ts_ms INTEGER, kind TEXT, used_mem_bytes INTEGER, "
    "sm_util_pct INTEGER, mem_util_pct INTEGER, rss_bytes INTEGER, cpu_pct REAL, "
    "gpu_instance_id INTEGER, compute_instance_id INTEGER"),
    ("gpu_index", "ts_ms", "pid"), 600_000)
HOST_SAMPLES = SampleTable("host_samples", _cols(
    "ts_ms INTEGER, cpu_pct REAL, load1 REAL, load5 REAL, load15 REAL, mem_total_bytes INTEGER, "
    "mem_used_bytes INTEGER, mem_available_bytes INTEGER, swap_used_bytes INTEGER, "
    "disk_read_bytes INTEGER, disk_write_bytes INTEGER, net_rx_bytes INTEGER, "
    "net_tx_bytes INTEGER, shm_total_bytes INTEGER, shm_used_bytes INTEGER"),
    ("ts_ms",), 60_000)
TABLES = {t.name: t for t in (GPU_SAMPLES, GPU_PROCESS_SAMPLES, HOST_SAMPLES)}
# migration_sql() builds the migration that introduced packing from these specs, so they must
# keep describing the tables as it left them: a later column needs its own migration (ALTER
# TABLE both physical tables, then the view and its trigger dropped and created again) and a
# spec that the earlier migration does not read.


# --- schema -----------------------------------------------------------------------------------

def _packed_columns(kind: str, name: str) -> list[str]:
    if kind == "TEXT":
        return [f"{name} TEXT"]
    cols = [f"{name} TEXT", f"{name}_b INTEGER", f"{name}_s INTEGER", f"{name}_g INTEGER"]
    return cols + [f"{name}_d INTEGER"] if kind == "REAL" else cols


def _numeric_sql(col: str, kind: str, k: str = "s.k") -> str:
    width = f"(length(p.{col}) / p.n)"
    digits = (f"CAST(nullif(substr(p.{col}, {k} * {width} + 1, {width}), "
              f"substr('{_NULL_DIGIT * 20}', 1, {width})) AS INTEGER)")
    line = f"p.{col}_b + p.{col}_s * {k}"
    expr = f"CASE WHEN p.{col} IS NULL THEN {line} ELSE {line} + p.{col}_g * {digits} END"
    return f"({expr}) * 1.0 / p.{col}_d" if kind == "REAL" else expr


def _decoded(table: SampleTable, columns: list[tuple[str, str]]) -> str:
    """SELECT list giving `columns` of the table from packed row p and slot s."""
    out = []
    for name, kind in columns:
        if name == "ts_ms":
            out.append(f"p.ts_ms + {_numeric_sql('t', 'INTEGER')}")
        elif name in table.keys:
            out.append(f"p.{name}")
        elif kind == "TEXT":
            # json_extract, not ->>: SQLite < 3.38 could not even load a schema holding ->>.
            out.append(f"json_extract(p.{name}, '$[' || s.k || ']')")
        else:
            out.append(_numeric_sql(name, kind))
    return ", ".join(f"{expr} AS {name}" for expr, (name, _) in zip(out, columns))


def select_sql(table: SampleTable, since_ms: int | None = None, until_ms: int | None = None,
               columns: tuple[str, ...] = ()) -> str:
    """Every sample of the table (the view's body), or only those with since <= ts_ms < until:
    then the packed side seeks only the buckets that can hold them. `columns` (default all):
    decoding only those makes a long range several times faster."""
    wanted = [(c, kind) for c, kind in table.columns
              if not columns or c in columns or (c == "ts_ms" and since_ms is not None)]
    names = ", ".join(c for c, _ in wanted)
    if since_ms is None:
        return (f"SELECT {names} FROM {table.recent} UNION ALL SELECT {_decoded(table, wanted)} "
                f"FROM {table.packed} p CROSS JOIN sample_slots s WHERE s.k < p.n")
    since_ms, until_ms = int(since_ms), int(until_ms)
    in_range = f"ts_ms >= {since_ms} AND ts_ms < {until_ms}"
    return (f"SELECT {names} FROM {table.recent} WHERE {in_range} UNION ALL "
            f"SELECT * FROM (SELECT {_decoded(table, wanted)} FROM {table.packed} p "
            f"CROSS JOIN sample_slots s WHERE s.k < p.n AND p.ts_ms > {since_ms - table.bucket_ms} "
            f"AND p.ts_ms < {until_ms}) WHERE {in_range}")


def between(name: str, since_ms: int, until_ms: int, alias: str = "", columns: tuple[str, ...] = ()) -> str:
    """A FROM item: the samples of table `name` with since <= ts_ms < until, named `alias`
    (default: like the table), with `columns` only if given."""
    return f"({select_sql(TABLES[name], since_ms, until_ms, columns)}) AS {alias or name}"


def migration_sql() -> str:
    """Plain tables become `_recent`; `_packed` tables, the views and their triggers appear."""
    out = ["CREATE TABLE sample_slots (k INTEGER PRIMARY KEY);  -- numbers the samples of a bucket",
           f"INSERT INTO sample_slots WITH RECURSIVE c(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM c "
           f"WHERE k < {SLOTS - 1}) SELECT k FROM c;"]
    for t in TABLES.values():
        cols = [f"{k} INTEGER NOT NULL" for k in t.keys]
        cols += ["ts_ms INTEGER NOT NULL", "n INTEGER NOT NULL"]
        cols += _packed_columns("INTEGER", "t")
        for name, kind in t.values:
            cols += _packed_columns(kind, name)
        names = ", ".join(c for c, _ in t.columns)
        news = ", ".join(f"NEW.{c}" for c, _ in t.columns)
        out += [
            f"ALTER TABLE {t.name} RENAME TO {t.recent};",
            # A rowid table: a bucket (a few KB) would spill into mostly empty overflow pages in
            # a WITHOUT ROWID b-tree, whose rows keep ~1 KB in the page.
            f"CREATE TABLE {t.packed} ({', '.join(cols)});",
            f"CREATE UNIQUE INDEX {t.packed}_key ON {t.packed} ({', '.join(t.pk)});",
            f"CREATE VIEW {t.name} AS {select_sql(t)};",
            f"CREATE TRIGGER {t.name}_insert INSTEAD OF INSERT ON {t.name} BEGIN "
            f"INSERT INTO {t.recent} ({names}) VALUES ({news}); END;",
        ]
    return "\n".join(out)


# --- encoding ---------------------------------------------------------------------------------

def _integers(values: list, kind: str) -> tuple[list[int | None], int] | None:
    """Values as integers and the divisor that gives them back, or None if not exactly."""
    present = [v for v in values if v is not None]
    if kind == "INTEGER":
        if any(type(v) is not int for v in present):
            return None
        return values, 1
    if any(type(v) not in (int, float) or not abs(v) < _MAX_ABS for v in present):
        return None
    for e in range(_MAX_DECIMALS + 1):
        scale = 10**e
        ints = [None if v is None else round(v * scale) for v in values]
        if all(v is None or i / scale == v for v, i in zip(values, ints)):
            return ints, scale
    return None


def _encode_numbers(values: list[int | None]) -> tuple | None:
    """(digits text, base, slope, step) for sample values in order; None if out of range."""
    present = [(k, v) for k, v in enumerate(values) if v is not None]
    if not present:
        return None, None, 0, 1
    if any(abs(v) >= _MAX_ABS for _, v in present):
        return None
    slopes = [0]
    (k0, v0), (k1, v1) = present[0], present[-1]
    if k1 > k0 and v1 != v0:
        slopes.append(round((v1 - v0) / (k1 - k0)))
    best = None
    for slope in slopes:
        rest = [v - slope * k for k, v in present]
        base = min(rest)
        step = math.gcd(*(r - base for r in rest)) or 1
        top = max(rest) - base
        if abs(base) >= _MAX_ABS or abs(slope) * len(values) >= _MAX_ABS:
            continue
        width = len(str(top // step)) if top else 0
        if best is None or width < best[0]:
            best = (width, slope, base, step)
    if best is None:
        return None
    width, slope, base, step = best
    if width == 0 and len(present) == len(values):
        return None, base, slope, step
    width = max(width, 1)
    digits = "".join(_NULL_DIGIT * width if v is None else str((v - slope * k - base) // step).zfill(width)
                     for k, v in enumerate(values))
    return digits, base, slope, step


def _encode_text(values: list) -> str | None:
    if all(v is None for v in values):
        return None
    return json.dumps(values, separators=(",", ":"))


def encode_bucket(table: SampleTable, bucket_ms: int, rows: list[tuple]) -> tuple | None:
    """The packed row (keys, ts_ms, n, encoded columns...) for one key's rows of one bucket,
    sorted by time and laid out as table.columns; None if it cannot be encoded exactly."""
    if len(rows) > SLOTS:
        return None
    index = {name: i for i, (name, _) in enumerate(table.columns)}
    out: list = [rows[0][index[k]] for k in table.keys] + [bucket_ms, len(rows)]
    encoded = _encode_numbers([r[index["ts_ms"]] - bucket_ms for r in rows])
    if encoded is None:
        return None
    out += encoded
    for name, kind in table.values:
        column = [r[index[name]] for r in rows]
        if kind == "TEXT":
            if any(v is not None and type(v) is not str for v in column):
                return None
            out.append(_encode_text(column))
            continue
        ints = _integers(column, kind)
        encoded = None if ints is None else _encode_numbers(ints[0])
        if encoded is None:
            return None
        out += encoded
        if kind == "REAL":
            out.append(ints[1])
    return tuple(out)


def pack(conn: sqlite3.Connection, table: SampleTable, since_ms: int | None,
         until_ms: int) -> tuple[int, int | None]:
    """Move complete buckets of plain rows from since_ms (None: the oldest) up to until_ms,
    KEEP_PLAIN_MS before the table's newest sample and PACK_SPAN_MS at most, into the packed
    table. Returns (rows moved, where the next call starts; None: nothing to pack yet)."""
    newest, oldest = conn.execute(f"SELECT max(ts_ms), min(ts_ms) FROM {table.recent}").fetchone()
    if newest is None:
        return 0, since_ms
    since = (oldest if since_ms is None else since_ms) // table.bucket_ms * table.bucket_ms
    until = min(until_ms, newest - KEEP_PLAIN_MS, since + PACK_SPAN_MS) // table.bucket_ms * table.bucket_ms
    if until <= since:
        return 0, since_ms
    names = [c for c, _ in table.columns]
    keys = [names.index(k) for k in table.keys]
    ts = names.index("ts_ms")
    order = ", ".join(list(table.keys) + ["ts_ms"])
    bucket_of = lambda r: (tuple(r[i] for i in keys), r[ts] // table.bucket_ms)  # noqa: E731
    rows = conn.execute(f"SELECT {', '.join(names)} FROM {table.recent} WHERE ts_ms >= ? AND ts_ms < ? "
                        f"ORDER BY {order}", (since, until)).fetchall()
    width = len(table.keys) + 2 + 4 + sum(len(_packed_columns(kind, c)) for c, kind in table.values)
    insert = f"INSERT OR IGNORE INTO {table.packed} VALUES ({', '.join('?' * width)})"
    key_match = "".join(f" AND {k} = ?" for k in table.keys)
    delete = f"DELETE FROM {table.recent} WHERE ts_ms >= ? AND ts_ms < ?{key_match}"
    moved = 0
    for (key, bucket), group in groupby(rows, bucket_of):
        group = list(group)
        start = bucket * table.bucket_ms
        packed = encode_bucket(table, start, group)
        if packed is None:
            continue  # stays plain: still read through the view, exactly
        if conn.execute(insert, packed).rowcount != 1:
            continue  # a bucket packed before (the clock stepped back): keep these plain
        conn.execute(delete, (start, start + table.bucket_ms, *key))
        moved += len(group)
    return moved, until

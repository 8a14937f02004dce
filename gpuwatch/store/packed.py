"""The packed raw tier of earlier schema versions, kept only so their databases upgrade.

Schema versions from the one that introduced packing until the one that removed it stored
gpu_samples, gpu_process_samples and host_samples as plain `<name>_recent` rows plus
`<name>_packed` buckets (one row per key and time bucket, each column's values encoded as
`c_b + c_s * k + c_g * digits_k`), read through VIEWs with the original names. A filter on
`ts_ms` could not seek through those views, so hand-written queries ran 36-50x slower than
on plain rows; the raw tier is plain indexed rows again (schema.py's `_PLAIN_RAW_SAMPLES`
decodes every bucket through the old views, once).

migration_sql() is that migration's SQL, built from these specs exactly as it was then: a
database upgraded from version 1 passes through it on its way to the plain tables.
"""

from __future__ import annotations

from dataclasses import dataclass

SLOTS = 4096  # most samples a bucket may hold: rows of sample_slots, which number them
_NULL_DIGIT = "x"


@dataclass(frozen=True)
class SampleTable:
    name: str
    columns: tuple[tuple[str, str], ...]  # (name, INTEGER | REAL | TEXT) in the table's order
    pk: tuple[str, ...]  # the plain table's primary key

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


GPU_SAMPLES = SampleTable(
    "gpu_samples",
    _cols(
        "gpu_index INTEGER, ts_ms INTEGER, gpu_util_pct INTEGER, mem_util_pct INTEGER, "
        "mem_used_bytes INTEGER, mem_free_bytes INTEGER, mem_reserved_bytes INTEGER, temp_c INTEGER, "
        "power_mw INTEGER, energy_mj INTEGER, sm_clock_mhz INTEGER, mem_clock_mhz INTEGER, "
        "pcie_tx_kbps INTEGER, pcie_rx_kbps INTEGER, fan_pct INTEGER, pstate INTEGER, "
        "throttle_reasons INTEGER, ecc_corrected INTEGER, ecc_uncorrected INTEGER, state TEXT"
    ),
    ("gpu_index", "ts_ms"),
)
GPU_PROCESS_SAMPLES = SampleTable(
    "gpu_process_samples",
    _cols(
        "gpu_index INTEGER, pid INTEGER, ts_ms INTEGER, kind TEXT, used_mem_bytes INTEGER, "
        "sm_util_pct INTEGER, mem_util_pct INTEGER, rss_bytes INTEGER, cpu_pct REAL, "
        "gpu_instance_id INTEGER, compute_instance_id INTEGER"
    ),
    ("gpu_index", "ts_ms", "pid"),
)
HOST_SAMPLES = SampleTable(
    "host_samples",
    _cols(
        "ts_ms INTEGER, cpu_pct REAL, load1 REAL, load5 REAL, load15 REAL, mem_total_bytes INTEGER, "
        "mem_used_bytes INTEGER, mem_available_bytes INTEGER, swap_used_bytes INTEGER, "
        "disk_read_bytes INTEGER, disk_write_bytes INTEGER, net_rx_bytes INTEGER, "
        "net_tx_bytes INTEGER, shm_total_bytes INTEGER, shm_used_bytes INTEGER"
    ),
    ("ts_ms",),
)
TABLES = {t.name: t for t in (GPU_SAMPLES, GPU_PROCESS_SAMPLES, HOST_SAMPLES)}
# migration_sql() builds the migration that introduced packing from these specs, so they must
# keep describing the tables as it left them; later columns go on the plain tables, in their
# own migrations.


# --- schema -----------------------------------------------------------------------------------


def _packed_columns(kind: str, name: str) -> list[str]:
    if kind == "TEXT":
        return [f"{name} TEXT"]
    cols = [f"{name} TEXT", f"{name}_b INTEGER", f"{name}_s INTEGER", f"{name}_g INTEGER"]
    return cols + [f"{name}_d INTEGER"] if kind == "REAL" else cols


def _numeric_sql(col: str, kind: str, k: str = "s.k") -> str:
    width = f"(length(p.{col}) / p.n)"
    digits = (
        f"CAST(nullif(substr(p.{col}, {k} * {width} + 1, {width}), "
        f"substr('{_NULL_DIGIT * 20}', 1, {width})) AS INTEGER)"
    )
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


def _view_sql(table: SampleTable) -> str:
    """Every sample of the table: plain rows, then each bucket's samples decoded."""
    names = ", ".join(c for c, _ in table.columns)
    return (
        f"SELECT {names} FROM {table.recent} UNION ALL SELECT {_decoded(table, list(table.columns))} "
        f"FROM {table.packed} p CROSS JOIN sample_slots s WHERE s.k < p.n"
    )


def migration_sql() -> str:
    """Plain tables become `_recent`; `_packed` tables, the views and their triggers appear."""
    out = [
        "CREATE TABLE sample_slots (k INTEGER PRIMARY KEY);  -- numbers the samples of a bucket",
        f"INSERT INTO sample_slots WITH RECURSIVE c(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM c "
        f"WHERE k < {SLOTS - 1}) SELECT k FROM c;",
    ]
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
            f"CREATE VIEW {t.name} AS {_view_sql(t)};",
            f"CREATE TRIGGER {t.name}_insert INSTEAD OF INSERT ON {t.name} BEGIN "
            f"INSERT INTO {t.recent} ({names}) VALUES ({news}); END;",
        ]
    return "\n".join(out)

"""Raw samples in plain tables: a database from the packed layout is upgraded in place with
every value kept, hand-written time filters seek the primary key, and a version-1 database
still upgrades through every migration.

tests/data/packed-v3.db.gz was written by gpuwatch 4a3e071 (the packed layout's last commit):
`open_rw(path)`, `fill(conn)` and `pack_all(conn)` as below, then VACUUM and gzip. Its plain rows
(the newest 10 minutes and a bucket that could not be encoded exactly) and its packed buckets
must come back as the rows fill() wrote.
"""

from __future__ import annotations

import gzip
import random
import sqlite3
from pathlib import Path

import pytest

from gpuwatch.analysis.export import run_tables
from gpuwatch.store import insert_rows, open_rw, queries
from gpuwatch.store.db import migrate
from gpuwatch.store.maintenance import maintain
from gpuwatch.store.schema import _COMPACT_SAMPLES, _PLAIN_RAW_SAMPLES, MIGRATIONS, SCHEMA_VERSION

S, MIN, H = 1000, 60_000, 3_600_000
BASE = 472_222 * H
MINUTES = 40
END = BASE + MINUTES * MIN
RAW = ("gpu_samples", "gpu_process_samples", "host_samples")
# host_samples' columns as the packed layout had them (later versions add more)
HOST_COLUMNS = (
    "ts_ms, cpu_pct, load1, load5, load15, mem_total_bytes, mem_used_bytes, "
    "mem_available_bytes, swap_used_bytes, disk_read_bytes, disk_write_bytes, "
    "net_rx_bytes, net_tx_bytes, shm_total_bytes, shm_used_bytes"
)
PACKED_V3 = Path(__file__).resolve().parent / "data" / "packed-v3.db.gz"
# Schema versions (the integrator orders migrations): before packing, and before its removal.
BEFORE_PACKING = MIGRATIONS.index(_COMPACT_SAMPLES)
PACKED = MIGRATIONS.index(_PLAIN_RAW_SAMPLES)


def fill(conn: sqlite3.Connection) -> None:
    """Two GPUs and the host at ~1 Hz, three processes every 5 s: smooth, constant, counter,
    NULL and lost values, and one load15 (1e-17) that the packed layout kept plain."""
    rng = random.Random(7)
    gpu = []
    for i in range(MINUTES * 60):
        for g in range(2):
            lost = g == 1 and 1000 <= i < 1030
            util = None if lost else (i * 7 + g) % 101
            gpu.append(
                (
                    g,
                    BASE + i * S + rng.randint(0, 9),
                    util,
                    None if lost else util // 2,
                    None if i % 13 == 0 else 2**33 + g * 2**20,
                    80 * 2**30 - 2**33,
                    2**29,
                    None if lost else 40 + (i // 60) % 30,
                    None if lost else 70_000 + 1000 * (i % 50),
                    123_456_789 + i * 301_234,
                    345 + 15 * (i % 80),
                    2619,
                    1000 * (i % 7),
                    0,
                    None,
                    0,
                    rng.choice([0, 4, 1 << 40]),
                    3,
                    0,
                    "lost" if lost else None,
                )
            )
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO gpu_samples VALUES ({', '.join('?' * 20)})", gpu)
    conn.executemany(
        f"INSERT INTO host_samples ({HOST_COLUMNS}) VALUES ({', '.join('?' * 15)})",
        [
            (
                BASE + i * S,
                round(rng.random() * 100, 1),
                rng.randint(0, 4000) / 2048,
                0.25,
                1e-17 if i == 5 else 0.5,
                64 * 2**30,
                2**35 + 4096 * (i % 10),
                2**35,
                0,
                10**9 + i * 4096,
                10**9,
                i * 1500,
                i * 1400,
                2**31,
                0,
            )
            for i in range(MINUTES * 60)
        ],
    )
    conn.executemany(
        "INSERT INTO gpu_process_samples (gpu_index, pid, ts_ms, kind, used_mem_bytes, sm_util_pct, "
        "mem_util_pct, rss_bytes, cpu_pct) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (
                g,
                4000 + p,
                BASE + i * 5 * S,
                "graphics" if p == 2 else None,
                (p + 1) * 2**30,
                i % 100,
                None if i % 3 else 7,
                2**31,
                rng.choice([None, 0.0, 99.9, 12.5]),
            )
            for i in range(MINUTES * 12)
            for g in range(2)
            for p in range(3)
        ],
    )
    conn.execute("COMMIT")
    insert_rows(
        conn,
        "processes",
        [
            {"pid": 4000 + p, "start_ms": BASE, "user": f"u{p}", "first_seen_ms": BASE, "last_seen_ms": END}
            for p in range(3)
        ],
    )
    insert_rows(
        conn,
        "runs",
        [
            {
                "run_id": "r1",
                "uid": 1,
                "pid": 4000,
                "started_ms": BASE + 60 * S,
                "ended_ms": END - 60 * S,
                "status": "finished",
                "gpu_uuids": "0,1",
            }
        ],
    )


def pack_all(conn: sqlite3.Connection) -> None:
    """maintain() as the fixture was made with it: rollups (and then, packing an hour a call)."""
    for _ in range(2):
        maintain(
            conn,
            END + 30 * S,
            raw_retention_ms=10**12,
            minute_retention_ms=10**12,
            hour_retention_ms=10**12,
            max_db_bytes=10**12,
        )


def dump(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    columns = {"host_samples": HOST_COLUMNS}
    return {
        t: conn.execute(f"SELECT {columns.get(t, '*')} FROM {t} ORDER BY 1, 2, 3").fetchall() for t in RAW
    }


def readers(conn: sqlite3.Connection) -> dict:
    """What queries, exports and the TUI's charts read from the raw tier."""
    return {
        "latest": queries.latest_gpu_samples(conn),
        "host": queries.latest_host_sample(conn),
        "processes": queries.gpu_processes(conn),
        "series": [
            queries.gpu_series(conn, g, m, BASE, END)
            for g in (0, 1)
            for m in ("gpu_util_pct", "power_mw", "mem_used_bytes")
        ],
        "host_series": queries.host_series(conn, "load1", BASE + 10 * MIN, BASE + 30 * MIN),
        "export": run_tables(conn, "r1")["gpu_samples"],
    }


@pytest.fixture
def upgraded_and_fresh(tmp_path):
    """The packed database upgraded in place, and the same samples written afresh and rolled up."""
    path = tmp_path / "old.db"
    path.write_bytes(gzip.decompress(PACKED_V3.read_bytes()))
    old = sqlite3.connect(path)
    assert old.execute("PRAGMA user_version").fetchone()[0] == PACKED
    assert old.execute("SELECT count(*) FROM gpu_samples_packed").fetchone()[0] > 0
    old.close()
    conn = open_rw(path)
    fresh = open_rw(tmp_path / "fresh.db")
    fill(fresh)
    pack_all(fresh)
    yield conn, fresh, path
    conn.close()
    fresh.close()


def test_a_packed_database_is_upgraded_to_plain_tables_with_every_value(upgraded_and_fresh):
    conn, fresh, path = upgraded_and_fresh
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    kinds = dict(conn.execute("SELECT name, type FROM sqlite_master"))
    assert {t: kinds.get(t) for t in RAW} == {t: "table" for t in RAW}
    assert not [n for n in kinds if n.endswith(("_recent", "_packed")) or n == "sample_slots"]
    assert not conn.execute("SELECT tier FROM rollup_state WHERE tier LIKE '%packed'").fetchall()
    assert dump(conn) == dump(fresh)
    got = readers(conn)
    assert got["latest"] and got["processes"] and got["export"] and all(got["series"])
    assert got == readers(fresh)
    # Values come back with their types: REAL stays float, bytes stay int.
    host = conn.execute("SELECT cpu_pct, load15, mem_used_bytes FROM host_samples LIMIT 1").fetchone()
    assert (type(host[0]), type(host[1]), type(host[2])) == (float, float, int)
    # The rollups made before the upgrade are kept, and maintenance goes on from them.
    rollups = conn.execute("SELECT * FROM gpu_samples_15m ORDER BY 1, 2").fetchall()
    assert len(rollups) == 2 * 2  # two GPUs, two complete quarter hours
    maintain(
        conn,
        END + 30 * S,
        raw_retention_ms=10**12,
        minute_retention_ms=10**12,
        hour_retention_ms=10**12,
        max_db_bytes=10**12,
    )
    assert conn.execute("SELECT * FROM gpu_samples_15m ORDER BY 1, 2").fetchall() == rollups
    migrate(conn, path)  # nothing left to apply: a no-op
    assert dump(conn) == dump(fresh)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_the_documented_queries_return_the_same_rows_after_the_upgrade(upgraded_and_fresh):
    conn, fresh, _ = upgraded_and_fresh
    readme = (Path(__file__).resolve().parent.parent / "docs" / "database.md").read_text()
    block = readme.split("```sql\n", 1)[1].split("```", 1)[0]
    # The queries look back from now; these samples end at END, on GPUs 0 and 1.
    block = block.replace("unixepoch()", str(END // 1000)).replace("gpu_index = 3", "gpu_index = 1")
    statements = [q for q in block.split(";") if q.strip()]
    assert len(statements) >= 5
    for sql in statements:
        assert conn.execute(sql).fetchall() == fresh.execute(sql).fetchall()
    who_used = next(q for q in statements if "gpu_process_samples" in q)
    assert len(conn.execute(who_used).fetchall()) == 3  # the three processes on GPU 1


# Hand-written filters as users write them, and the key SQLite must seek for each.
SEEKS = [
    (
        "SELECT avg(gpu_util_pct) FROM gpu_samples WHERE gpu_index = 1 AND ts_ms >= ?",
        "gpu_index=? AND ts_ms>?",
    ),
    (
        "SELECT * FROM gpu_samples WHERE gpu_index = 1 AND ts_ms BETWEEN ? AND ? + 3600000",
        "gpu_index=? AND ts_ms>? AND ts_ms<?",
    ),
    ("SELECT max(cpu_pct) FROM host_samples WHERE ts_ms >= ?", "ts_ms>?"),
    (
        "SELECT pid, max(used_mem_bytes) FROM gpu_process_samples WHERE gpu_index = 0 AND ts_ms >= ? "
        "GROUP BY pid",
        "gpu_index=? AND ts_ms>?",
    ),
]


@pytest.mark.parametrize("sql, key", SEEKS)
def test_a_hand_written_time_filter_seeks_the_primary_key(tmp_path, sql, key):
    conn = open_rw(tmp_path / "gw.db")
    plan = " ".join(r[-1] for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", (BASE,) * sql.count("?")))
    assert "SEARCH" in plan and f"PRIMARY KEY ({key})" in plan, plan


def test_a_version_1_database_upgrades_through_every_migration(tmp_path):
    path = tmp_path / "v1.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(
        f"BEGIN; {' '.join(MIGRATIONS[:BEFORE_PACKING])} PRAGMA user_version = {BEFORE_PACKING}; COMMIT;"
    )
    fill(old)
    v1 = dump(old)
    # Two rolled-up minutes of a 15-minute period, and one of the next, part-done period.
    old.executemany(
        "INSERT INTO gpu_samples_1m (gpu_index, ts_ms, n, gpu_util_pct_min, gpu_util_pct_avg, "
        "gpu_util_pct_max, power_mw_avg) VALUES (0, ?, ?, ?, ?, ?, ?)",
        [
            (BASE, 60, 5, 10.0, 20, 100_000),
            (BASE + MIN, 30, 1, 40.0, 90, 200_001),
            (BASE + 15 * MIN, 60, 0, 1.0, 2, 1),
        ],
    )
    old.execute("INSERT INTO rollup_state VALUES ('gpu_samples_1m', ?)", (BASE + 16 * MIN,))
    old.close()

    conn = open_rw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert dump(conn) == v1
    # Minutes fold into 15-minute periods, weighted by their sample counts; the part-done
    # period is left to be rolled up again from the raw samples.
    assert conn.execute(
        "SELECT gpu_index, ts_ms, n, gpu_util_pct_min, gpu_util_pct_avg, gpu_util_pct_max, "
        "power_mw_avg FROM gpu_samples_15m"
    ).fetchall() == [(0, BASE, 90, 1, 20.0, 90, 133_334)]
    assert (
        conn.execute("SELECT done_until_ms FROM rollup_state WHERE tier = 'gpu_samples_15m'").fetchone()[0]
        == BASE + 15 * MIN
    )
    pack_all(conn)
    assert dump(conn) == v1
    assert conn.execute(
        "SELECT n FROM gpu_samples_15m WHERE gpu_index = 0 AND ts_ms = ?", (BASE + 15 * MIN,)
    ).fetchone() == (900,)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("table", RAW)
def test_raw_tables_keep_the_columns_and_key_of_the_first_schema(tmp_path, table):
    conn = open_rw(tmp_path / "gw.db")
    v1 = sqlite3.connect(":memory:")
    v1.executescript(" ".join(MIGRATIONS[:BEFORE_PACKING]))
    columns = lambda c: [(r[1], r[2], r[5]) for r in c.execute(f"PRAGMA table_info({table})")]  # noqa: E731
    # later versions may add columns at the end (host_samples' swap counters), never change one
    assert columns(conn)[: len(columns(v1))] == columns(v1)

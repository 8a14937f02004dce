"""Packed raw samples: exact round trips through the views, readers that see the same values
packed or plain, and the in-place migration of a version-1 database."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from gpuwatch.analysis.export import run_tables
from gpuwatch.store import insert_rows, open_rw, packed, queries
from gpuwatch.store.db import migrate
from gpuwatch.store.maintenance import maintain
from gpuwatch.store.schema import _COMPACT_SAMPLES, MIGRATIONS, SCHEMA_VERSION

S, MIN, H = 1000, 60_000, 3_600_000
BASE = 472_222 * H
HOURS = 2


def gpu_rows(rng: random.Random) -> list[tuple]:
    """Two GPUs at ~1 Hz with jitter: smooth, noisy, constant, counter, NULL and lost values."""
    rows = []
    for i in range(HOURS * 3600):
        for g in range(2):
            lost = g == 1 and 1000 <= i < 1030
            util = None if lost else (i * 7 + g) % 101
            rows.append((g, BASE + i * S + rng.randint(0, 9), util, None if lost else util // 2,
                         None if i % 13 == 0 else 2**33 + g * 2**20, 80 * 2**30 - 2**33, 2**29,
                         None if lost else 40 + (i // 60) % 30, None if lost else 70_000 + rng.randint(0, 600_000),
                         123_456_789 + i * 301_234 + rng.randint(0, 2000), 345 + 15 * (i % 80), 2619,
                         rng.randint(0, 25_000_000), rng.choice([0, 5, 24_999_999]), None, 0,
                         rng.choice([0, 4, 1 << 40]), 3, 0, "lost" if lost else None))
    return rows


def fill(conn: sqlite3.Connection, seed: int = 7) -> None:
    rng = random.Random(seed)
    gpu_cols = [c for c, _ in packed.GPU_SAMPLES.columns]
    host_cols = [c for c, _ in packed.HOST_SAMPLES.columns]
    conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO gpu_samples ({', '.join(gpu_cols)}) VALUES ({', '.join('?' * len(gpu_cols))})",
                     gpu_rows(rng))
    conn.executemany(
        f"INSERT INTO host_samples ({', '.join(host_cols)}) VALUES ({', '.join('?' * len(host_cols))})",
        # load15 1e-17 once: a bucket that cannot be packed exactly, which stays plain
        [(BASE + i * S, round(rng.random() * 100, 1), rng.randint(0, 4000) / 2048, 0.25,
          1e-17 if i == 5 else 0.5, 64 * 2**30, rng.randint(0, 2**36), 2**35, 0, 10**9 + i * 4096,
          10**9 + i * rng.randint(0, 9), i * 1500, i * 1400, 2**31, rng.randint(0, 10**6)) for i in range(HOURS * 3600)])
    conn.executemany(
        "INSERT INTO gpu_process_samples (gpu_index, pid, ts_ms, kind, used_mem_bytes, sm_util_pct, "
        "mem_util_pct, rss_bytes, cpu_pct) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(g, 4000 + p, BASE + i * 5 * S, "graphics" if p == 2 else None, (p + 1) * 2**30,
          rng.randint(0, 100), None if i % 3 else 7, 2**31 + rng.randint(0, 2**20),
          rng.choice([None, 0.0, 99.9, 12.5])) for i in range(HOURS * 720) for g in range(2) for p in range(3)])
    conn.execute("COMMIT")
    insert_rows(conn, "processes", [{"pid": 4000 + p, "start_ms": BASE, "user": f"u{p}",
                                     "first_seen_ms": BASE, "last_seen_ms": BASE + HOURS * H} for p in range(3)])
    insert_rows(conn, "runs", [{"run_id": "r1", "uid": 1, "pid": 4000, "started_ms": BASE + 60 * S,
                                "ended_ms": BASE + HOURS * H - 60 * S, "status": "finished",
                                "gpu_uuids": "0,1"}])


def dump(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall() for t in packed.TABLES}


def readers(conn: sqlite3.Connection) -> dict:
    """What queries, exports and the TUI's charts read from the raw tier."""
    end = BASE + HOURS * H
    return {
        "latest": queries.latest_gpu_samples(conn),
        "host": queries.latest_host_sample(conn),
        "processes": queries.gpu_processes(conn),
        "series": [queries.gpu_series(conn, g, m, BASE, BASE + H)
                   for g in (0, 1) for m in ("gpu_util_pct", "power_mw", "mem_used_bytes")],
        "host_series": queries.host_series(conn, "load1", BASE + 10 * MIN, BASE + 70 * MIN),
        "export": run_tables(conn, "r1")["gpu_samples"],
        "range": conn.execute(f"SELECT * FROM {packed.between('gpu_samples', BASE + 59 * MIN, BASE + 61 * MIN)} "
                              "ORDER BY ts_ms, gpu_index").fetchall(),
        "end": end,
    }


def run_maintain(conn) -> None:
    for _ in range(HOURS + 1):  # as minutes pass: each call packs an hour at most
        maintain(conn, BASE + HOURS * H + 30 * S, raw_retention_ms=10**12, minute_retention_ms=10**12,
                 hour_retention_ms=10**12, max_db_bytes=10**12)


@pytest.fixture
def plain_and_packed(tmp_path, monkeypatch):
    """The same samples twice, rolled up: all in plain rows (the old layout), and packed."""
    plain = open_rw(tmp_path / "plain.db")
    fill(plain)
    monkeypatch.setattr(packed, "KEEP_PLAIN_MS", 10**12)  # nothing old enough to pack
    run_maintain(plain)
    assert plain.execute("SELECT count(*) FROM gpu_samples_packed").fetchone()[0] == 0
    monkeypatch.undo()
    conn = open_rw(tmp_path / "packed.db")
    fill(conn)
    run_maintain(conn)
    yield plain, conn
    plain.close()
    conn.close()


def test_packing_keeps_every_value_and_what_every_reader_returns(plain_and_packed):
    plain, conn = plain_and_packed
    for t in packed.TABLES.values():  # nearly all went into buckets; the newest stay plain
        plain_rows = conn.execute(f"SELECT count(*), max(ts_ms) FROM {t.recent}").fetchone()
        assert plain_rows[0] < conn.execute(f"SELECT count(*) FROM {t.name}").fetchone()[0] / 4
        assert plain_rows[1] == conn.execute(f"SELECT max(ts_ms) FROM {t.name}").fetchone()[0]
    assert dump(conn) == dump(plain)
    got, want = readers(conn), readers(plain)
    assert got["latest"] and got["processes"] and got["export"] and got["range"]
    assert got == want
    # Values come back with their types: REAL stays float, bytes stay int.
    host = conn.execute("SELECT cpu_pct, load15, mem_used_bytes FROM host_samples LIMIT 1").fetchone()
    assert (type(host[0]), type(host[1]), type(host[2])) == (float, float, int)


def test_the_readmes_queries_return_the_same_rows_from_packed_samples(plain_and_packed):
    plain, conn = plain_and_packed
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("```sql\n", 1)[1].split("```", 1)[0]
    # The queries look back from now; these samples end at BASE + HOURS h, on GPUs 0 and 1.
    block = block.replace("unixepoch()", str((BASE + HOURS * H) // 1000)).replace("gpu_index = 3", "gpu_index = 1")
    statements = [q for q in block.split(";") if q.strip()]
    assert len(statements) == 5
    for sql in statements:
        assert conn.execute(sql).fetchall() == plain.execute(sql).fetchall()
    who_used = next(q for q in statements if "gpu_process_samples" in q)
    assert len(conn.execute(who_used).fetchall()) == 3  # the three processes on GPU 1


def test_codec_round_trips_random_columns_exactly(tmp_path):
    conn = open_rw(tmp_path / "gw.db")
    rng = random.Random(3)
    ints = [None, 0, -1, 2**52, -(2**52), 1 << 40]
    reals = [None, 0.1, 2.5e-7, -0.0, 123456.789, 0.2841796875]
    ts, rows = BASE, []
    for i in range(3000):
        ts += rng.choice([1, 997, 1000, 30_001])
        # 1/3 and 1e300 have no exact short decimal: those two buckets must stay plain
        cpu = 1 / 3 if i == 17 else 1e300 if i == 42 else rng.choice(reals)
        rows.append((rng.choice([0, 1]), 7, ts, rng.choice([None, None, "graphics"]),
                     rng.choice(ints + [rng.randint(-10**9, 10**9)]), rng.randint(0, 1), None, None, cpu,
                     rng.choice([None, 1, 13]), None))
    conn.executemany("INSERT INTO gpu_process_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    before = dump(conn)
    conn.execute("BEGIN")
    moved, mark = 0, None
    while True:  # an hour a call
        n, after = packed.pack(conn, packed.GPU_PROCESS_SAMPLES, mark, BASE + 10**9)
        moved += n
        if after == mark:
            break
        mark = after
    conn.execute("COMMIT")
    assert moved > 2500
    assert dump(conn) == before


# The schema version before the migration that packs samples (the lead orders migrations).
BEFORE = MIGRATIONS.index(_COMPACT_SAMPLES)


def test_a_database_from_before_packing_is_migrated_in_place_and_keeps_every_value(tmp_path):
    path = tmp_path / "old.db"
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(f"BEGIN; {' '.join(MIGRATIONS[:BEFORE])} PRAGMA user_version = {BEFORE}; COMMIT;")
    fill(old)
    v1 = {t: old.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall() for t in packed.TABLES}
    # Two rolled-up minutes of a 15-minute period, and one of the next, part-done period.
    old.executemany("INSERT INTO gpu_samples_1m (gpu_index, ts_ms, n, gpu_util_pct_min, gpu_util_pct_avg, "
                    "gpu_util_pct_max, power_mw_avg) VALUES (0, ?, ?, ?, ?, ?, ?)",
                    [(BASE, 60, 5, 10.0, 20, 100_000), (BASE + MIN, 30, 1, 40.0, 90, 200_001),
                     (BASE + 15 * MIN, 60, 0, 1.0, 2, 1)])
    old.execute("INSERT INTO rollup_state VALUES ('gpu_samples_1m', ?)", (BASE + 16 * MIN,))
    old.close()

    conn = open_rw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert dump(conn) == v1
    # Minutes fold into 15-minute periods, weighted by their sample counts; the part-done
    # period is left to be rolled up again from the raw samples.
    assert conn.execute("SELECT gpu_index, ts_ms, n, gpu_util_pct_min, gpu_util_pct_avg, gpu_util_pct_max, "
                        "power_mw_avg FROM gpu_samples_15m").fetchall() == [(0, BASE, 90, 1, 20.0, 90, 133_334)]
    assert conn.execute("SELECT done_until_ms FROM rollup_state WHERE tier = 'gpu_samples_15m'").fetchone()[0] \
        == BASE + 15 * MIN
    assert not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'gpu_samples_1m'").fetchone()
    run_maintain(conn)
    assert conn.execute("SELECT count(*) FROM gpu_samples_packed").fetchone()[0] > 0
    assert dump(conn) == v1
    assert conn.execute("SELECT n FROM gpu_samples_15m WHERE gpu_index = 0 AND ts_ms = ?",
                        (BASE + 15 * MIN,)).fetchone() == (900,)
    migrate(conn, path)  # nothing left to apply: a no-op
    assert dump(conn) == v1
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("table", sorted(packed.TABLES))
def test_views_keep_the_columns_of_the_old_tables(tmp_path, table):
    conn = open_rw(tmp_path / "gw.db")
    v1 = sqlite3.connect(":memory:")
    v1.executescript(" ".join(MIGRATIONS[:BEFORE]))
    columns = lambda c: [(r[1], r[2]) for r in c.execute(f"PRAGMA table_info({table})")]  # noqa: E731
    assert columns(conn) == columns(v1)

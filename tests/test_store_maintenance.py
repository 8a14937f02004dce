"""Rollups, retention and the size cap, over hours of injected 1 Hz samples."""

from __future__ import annotations

import os
from statistics import mean

import pytest

from gpuwatch.store import insert_rows, open_rw, queries
from gpuwatch.store.maintenance import maintain

S, MIN, H, DAY = 1000, 60_000, 3_600_000, 86_400_000
BASE = 472_222 * H  # an hour boundary in November 2023
HOURS = 3


def util(g: int, i: int) -> int | None:
    """GPU utilisation at second i: a saw-tooth per minute. In the first hour GPU 0 misses the
    second half of every minute of the odd 15-minute periods, which hold 450 samples, not 900."""
    if g == 0 and i < 3600 and (i // 900) % 2 and i % 60 >= 30:
        return None
    return i % 60 + g


def samples(seconds: range, gpus: int = 2) -> list[tuple]:
    return [
        (g, BASE + i * S, util(g, i), 10**9 * (g + 1) + i, 40 + g)
        for i in seconds
        for g in range(gpus)
        if util(g, i) is not None
    ]


def insert_samples(conn, seconds: range) -> None:
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO gpu_samples (gpu_index, ts_ms, gpu_util_pct, mem_used_bytes, temp_c) "
        "VALUES (?, ?, ?, ?, ?)",
        samples(seconds),
    )
    conn.executemany(
        "INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (?, ?)",
        [(BASE + i * S, float(i % 100)) for i in seconds],
    )
    conn.execute("COMMIT")


def run_maintain(conn, now, raw=H, minute=14 * DAY, hour=365 * DAY, cap=10**12):
    return maintain(
        conn, now, raw_retention_ms=raw, minute_retention_ms=minute, hour_retention_ms=hour, max_db_bytes=cap
    )


def dump(conn, table):
    return conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()


@pytest.fixture
def conn(tmp_path):
    c = open_rw(tmp_path / "gw.db")
    insert_samples(c, range(HOURS * 3600))
    yield c
    c.close()


NOW = BASE + HOURS * H + 30 * S  # 30 s after the last sample: every minute is complete


def test_ten_minute_rollup_min_avg_max(conn):
    report = run_maintain(conn, NOW)
    assert report.rolled_up["gpu_samples_15m"] == 2 * HOURS * 4
    rows = {
        (g, ts): (n, lo, avg, hi)
        for g, ts, n, lo, avg, hi in conn.execute(
            "SELECT gpu_index, ts_ms, n, gpu_util_pct_min, gpu_util_pct_avg, gpu_util_pct_max "
            "FROM gpu_samples_15m"
        )
    }
    assert rows[(1, BASE)] == (900, 1, 30.5, 60)
    assert rows[(0, BASE)] == (900, 0, 29.5, 59)
    assert rows[(0, BASE + 15 * MIN)] == (450, 0, 14.5, 29)  # half of each minute
    assert rows[(0, BASE + 75 * MIN)] == (900, 0, 29.5, 59)  # whole again in hour two
    mem = conn.execute(
        "SELECT mem_used_bytes_min, mem_used_bytes_avg, mem_used_bytes_max "
        "FROM gpu_samples_15m WHERE gpu_index = 1 AND ts_ms = ?",
        (BASE + 15 * MIN,),
    ).fetchone()
    assert mem == (2 * 10**9 + 900, 2 * 10**9 + 1350, 2 * 10**9 + 1799)  # byte averages: whole bytes
    assert isinstance(mem[1], int)
    host = conn.execute(
        "SELECT n, cpu_pct_min, cpu_pct_max FROM host_samples_15m WHERE ts_ms = ?", (BASE + 30 * MIN,)
    ).fetchone()
    assert host == (900, 0.0, 99.0)


def test_hour_rollup_weights_minutes_by_sample_count(conn):
    run_maintain(conn, NOW)
    n, lo, avg, hi = conn.execute(
        "SELECT n, gpu_util_pct_min, gpu_util_pct_avg, gpu_util_pct_max FROM gpu_samples_1h "
        "WHERE gpu_index = 0 AND ts_ms = ?",
        (BASE,),
    ).fetchone()
    first_hour = [util(0, i) for i in range(3600) if util(0, i) is not None]
    assert n == len(first_hour) == 2700
    assert avg == pytest.approx(mean(first_hour))  # 24.5; an unweighted mean of periods gives 22
    assert (lo, hi) == (0, 59)
    assert conn.execute("SELECT count(*) FROM gpu_samples_1h").fetchone()[0] == 2 * HOURS


def test_rerunning_changes_nothing_and_later_runs_add_only_new_periods(conn):
    run_maintain(conn, NOW)
    tables = ("gpu_samples_15m", "gpu_samples_1h", "host_samples_15m", "host_samples_1h", "gpu_samples")
    before = {t: dump(conn, t) for t in tables}
    again = run_maintain(conn, NOW)
    assert not any(again.rolled_up.values())
    assert {t: dump(conn, t) for t in tables} == before
    insert_samples(conn, range(HOURS * 3600, HOURS * 3600 + 900))  # fifteen more minutes
    later = run_maintain(conn, NOW + 15 * MIN)
    assert later.rolled_up["gpu_samples_15m"] == 2
    assert later.rolled_up["gpu_samples_1h"] == 0  # hour four is not complete
    assert set(before["gpu_samples_15m"]) < set(dump(conn, "gpu_samples_15m"))


def test_raw_beyond_retention_is_deleted_but_its_rollup_stays(conn):
    report = run_maintain(conn, NOW, raw=H)
    # Packed raw samples are a minute to a row, and a row goes once all of it is too old.
    oldest = conn.execute("SELECT min(ts_ms) FROM gpu_samples").fetchone()[0]
    assert NOW - H - MIN < oldest <= NOW - H
    assert report.retention_deleted["gpu_samples"] == len(samples(range((oldest - BASE) // S)))
    assert conn.execute("SELECT min(ts_ms) FROM gpu_samples_15m").fetchone()[0] == BASE
    assert conn.execute("SELECT min(ts_ms) FROM host_samples").fetchone()[0] == oldest


def test_raw_is_kept_until_rolled_up(conn):
    # The 15-minute tier has never run before a clock 2 days on: rollup first, then delete.
    run_maintain(conn, BASE + 2 * DAY, raw=H)
    assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 0
    assert conn.execute("SELECT sum(n) FROM gpu_samples_15m").fetchone()[0] == len(
        samples(range(HOURS * 3600))
    )


def test_ten_minute_tier_expires_after_hour_rollup_and_hour_tier_expires(conn):
    run_maintain(conn, BASE + 2 * DAY, raw=H, minute=DAY, hour=365 * DAY)
    assert conn.execute("SELECT count(*) FROM gpu_samples_15m").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM gpu_samples_1h").fetchone()[0] == 2 * HOURS
    run_maintain(conn, BASE + 2 * H + 400 * DAY, hour=365 * DAY)
    assert conn.execute("SELECT count(*) FROM gpu_samples_1h").fetchone()[0] == 0


def test_series_come_from_the_tier_that_holds_the_range(conn):
    run_maintain(conn, NOW, raw=H)
    # Three hours whose first two have no raw samples left: the 15-minute tier, a point each.
    points = queries.gpu_series(conn, 0, "gpu_util_pct", BASE, BASE + HOURS * H)
    assert len(points) == HOURS * 4
    assert (points[0].min, points[0].avg, points[0].max) == (0, 29.5, 59)
    assert points[1].avg == 14.5
    # Half an hour whose raw samples were deleted: falls through to the 15-minute tier.
    assert (
        queries.series_tier(conn, "gpu_samples", ("gpu_index", 0), BASE, BASE + 30 * MIN)[0]
        == "gpu_samples_15m"
    )
    # The last half hour is still raw.
    assert queries.series_tier(conn, "gpu_samples", ("gpu_index", 0), NOW - 30 * MIN, NOW)[0] == "gpu_samples"
    # Ten days: the hour tier, hours weighted by their sample counts.
    ten_days = queries.gpu_series(conn, 0, "gpu_util_pct", BASE, BASE + 10 * DAY)
    assert (
        queries.series_tier(conn, "gpu_samples", ("gpu_index", 0), BASE, BASE + 10 * DAY)[0]
        == "gpu_samples_1h"
    )
    assert len(ten_days) == HOURS  # 10 days / 240 points = 1 h buckets, data in three
    assert ten_days[0].avg == pytest.approx(mean(u for i in range(3600) if (u := util(0, i)) is not None))
    whole = queries.gpu_series(conn, 0, "gpu_util_pct", BASE, BASE + 10 * DAY, max_points=2)
    assert whole[0].avg == pytest.approx(
        mean(u for i in range(HOURS * 3600) if (u := util(0, i)) is not None)
    )
    host = queries.host_series(conn, "cpu_pct", BASE, BASE + HOURS * H, max_points=HOURS)
    assert [p.ts_ms for p in host] == [BASE, BASE + H, BASE + 2 * H]


def _fill_for_cap(conn, ticks: int):
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO gpu_samples (gpu_index, ts_ms, gpu_util_pct, mem_used_bytes, power_mw) VALUES (?, ?, ?, ?, ?)",
        [(g, BASE + i * S, i % 100, 10**10 + i, 300_000 + i) for i in range(ticks) for g in range(8)],
    )
    conn.executemany(
        "INSERT INTO gpu_process_samples (gpu_index, pid, ts_ms, used_mem_bytes) VALUES (?, ?, ?, ?)",
        [(g, 1000 + p, BASE + i * S, 2**33 + i) for i in range(ticks) for g in range(8) for p in range(3)],
    )
    conn.execute("COMMIT")
    insert_rows(
        conn,
        "runs",
        [{"run_id": f"r{k}", "uid": 1, "started_ms": BASE + k, "status": "finished"} for k in range(3)],
    )
    insert_rows(
        conn,
        "steps",
        [{"run_id": f"r{k}", "step": s, "ts_ms": BASE + s, "tokens": 1} for k in range(3) for s in range(50)],
    )


def test_size_cap_deletes_oldest_samples_and_keeps_newest_and_runs(tmp_path):
    path = tmp_path / "gw.db"
    conn = open_rw(path)
    ticks = 1800
    _fill_for_cap(conn, ticks)
    newest = BASE + (ticks - 1) * S
    now = newest + 30 * S
    run_maintain(conn, now, raw=DAY)  # roll up and checkpoint, no cap yet
    full = os.path.getsize(path)
    cap = full // 2
    report = run_maintain(conn, now, raw=DAY, cap=cap)
    assert os.path.getsize(path) <= cap
    assert report.db_bytes_after <= cap < report.db_bytes_before
    assert report.cap_deleted["gpu_samples"] > 0 and not report.over_cap
    assert conn.execute("SELECT max(ts_ms) FROM gpu_samples WHERE gpu_index = 7").fetchone()[0] == newest
    assert conn.execute("SELECT min(ts_ms) FROM gpu_samples WHERE gpu_index = 0").fetchone()[0] > BASE
    assert (
        conn.execute("SELECT count(*) FROM gpu_samples_15m").fetchone()[0] == 8 * ticks // 900
    )  # rollups kept
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 3
    assert conn.execute("SELECT count(*) FROM steps").fetchone()[0] == 150
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_size_cap_deletes_oldest_finished_runs_only_when_nothing_else_is_left(tmp_path):
    path = tmp_path / "gw.db"
    conn = open_rw(path)
    insert_rows(
        conn,
        "runs",
        [{"run_id": "live", "uid": 1, "started_ms": 1, "status": "running"}]
        + [{"run_id": f"r{k}", "uid": 1, "started_ms": 10 + k, "status": "finished"} for k in range(20)],
    )
    insert_rows(
        conn,
        "steps",
        [
            {"run_id": rid, "step": s, "ts_ms": s, "loss": 1.0 / (s + 1)}
            for rid in ["live"] + [f"r{k}" for k in range(20)]
            for s in range(400)
        ],
    )
    insert_rows(conn, "gpu_samples", [{"gpu_index": 0, "ts_ms": t, "gpu_util_pct": 1} for t in range(100)])
    insert_rows(
        conn,
        "profiles",
        [{"id": k, "run_id": f"r{k}", "ts_ms": 5, "trigger": "scheduled"} for k in range(20)],
    )
    insert_rows(
        conn, "profile_breakdowns", [{"profile_id": k, "gpu": 1, "breakdown_json": "{}"} for k in range(20)]
    )
    run_maintain(conn, 10**7)
    cap = os.path.getsize(path) * 3 // 4
    report = run_maintain(conn, 10**7, cap=cap)
    left = [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY started_ms")]
    assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 0  # samples went first
    assert report.runs_deleted > 0 and left[0] == "live" and len(left) > 2 and not report.over_cap
    assert left[1:] == [f"r{k}" for k in range(20 - len(left) + 1, 20)]  # the oldest went
    assert conn.execute("SELECT count(DISTINCT run_id) FROM steps").fetchone()[0] == len(left)
    # a deleted run's profiles go with their breakdowns
    assert conn.execute("SELECT count(*) FROM profile_breakdowns").fetchone()[0] == len(left) - 1
    assert os.path.getsize(path) <= cap
    conn.close()

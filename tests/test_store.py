"""The store: opening, migrations, sharing with other users, the writer, and the read queries."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.store import StoreError, Writer, insert_rows, open_ro, open_rw, queries
from gpuwatch.store.schema import SCHEMA_VERSION
from gpuwatch.store.writer import JobRefused, StoreFailed

NOBODY = 65534


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "gw.db"
    conn = open_rw(path)
    yield conn
    conn.close()


@pytest.fixture
def shared_dir():
    """A directory other users can reach (pytest's tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="gw-shared-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=True)


def run_as_nobody(code: str) -> subprocess.CompletedProcess:
    """Run code in a child that imports the store as root, then drops to uid/gid 65534 for good.

    (The interpreter lives under /root, which nobody cannot enter, so the drop happens after
    the imports instead of in preexec_fn.)
    """
    prelude = (
        "import os, sqlite3, sys\nfrom gpuwatch.store import open_ro, StoreError\n"
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
    )
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60)


# --- opening and migrations ------------------------------------------------------------------


def test_new_database_is_migrated_with_incremental_auto_vacuum(db):
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
    applied = db.execute("SELECT version, applied_ms FROM migrations").fetchall()
    assert [v for v, _ in applied] == list(range(1, SCHEMA_VERSION + 1))
    assert all(ms > 1_600_000_000_000 for _, ms in applied)


def test_reopening_does_not_reapply_migrations(tmp_path):
    path = tmp_path / "gw.db"
    open_rw(path).close()
    conn = open_rw(path)
    assert conn.execute("SELECT count(*) FROM migrations").fetchone()[0] == SCHEMA_VERSION
    conn.close()


@pytest.mark.slow
def test_processes_creating_one_database_at_once_all_open_it(tmp_path):
    """The ranks of a torchrun job with no daemon open the same new embedded database at the
    same moment: each must find it created once, not fail on a table another one just made."""
    path = tmp_path / "gw.db"
    code = (
        "import sys, time\nfrom gpuwatch.store import open_rw\n"
        "start = float(sys.argv[2])\n"
        "time.sleep(max(start - time.time() - 0.05, 0))\n"
        "while time.time() < start: pass\n"  # start together: the last 50 ms spun
        "conn = open_rw(sys.argv[1])\n"
        "print(conn.execute('PRAGMA user_version').fetchone()[0])"
    )
    for attempt in range(5):
        path.unlink(missing_ok=True)
        start = time.time() + 0.75  # past every child's imports (a late one only races less)
        children = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(path), str(start)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        results = [(child.wait(timeout=60), *child.communicate()) for child in children]
        assert all(rc == 0 and out.strip() == str(SCHEMA_VERSION) for rc, out, _ in results), (
            attempt,
            results,
        )
    conn = open_rw(path)
    assert conn.execute("SELECT count(*) FROM migrations").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_newer_schema_is_refused_and_data_kept(tmp_path):
    path = tmp_path / "gw.db"
    conn = open_rw(path)
    conn.execute("INSERT INTO host_samples (ts_ms, cpu_pct) VALUES (1, 5.0)")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    for opener in (open_rw, open_ro):
        with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION + 1}, newer"):
            opener(path)
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT ts_ms, cpu_pct FROM host_samples").fetchall() == [(1, 5.0)]
    raw.close()


def test_open_ro_of_missing_file_says_so(tmp_path):
    with pytest.raises(StoreError, match="no such database"):
        open_ro(tmp_path / "absent.db")


def test_open_ro_refuses_writes(db, tmp_path):
    ro = open_ro(tmp_path / "gw.db")
    with pytest.raises(sqlite3.DatabaseError):
        ro.execute("INSERT INTO host_samples (ts_ms) VALUES (1)")
    ro.close()


# --- sharing with users who cannot write -------------------------------------------------------


def test_files_and_directory_are_world_readable_despite_umask(shared_dir):
    path = shared_dir / "state" / "gw.db"
    old = os.umask(0o077)
    try:
        writer = Writer(path)
        writer.insert("host_samples", [{"ts_ms": 1, "cpu_pct": 1.0}])
        assert writer.flush(10)
        modes = {p.name: p.stat().st_mode & 0o777 for p in path.parent.iterdir()}
        assert modes == {"gw.db": 0o644, "gw.db-wal": 0o644, "gw.db-shm": 0o644}
        assert path.parent.stat().st_mode & 0o777 == 0o755
        writer.close()
    finally:
        os.umask(old)


def test_other_user_reads_live_database_and_snapshot_after_writer_exits(shared_dir):
    path = shared_dir / "gw.db"
    writer = Writer(path)
    writer.insert("host_samples", [{"ts_ms": t, "cpu_pct": 1.0} for t in range(5)])
    assert writer.flush(10)
    read = (
        f"assert not os.access({str(path)!r}, os.W_OK)\n"
        f"assert not os.access({str(shared_dir)!r}, os.W_OK)\n"
        f"conn = open_ro({str(path)!r})\n"
        "n = conn.execute('SELECT count(*) FROM host_samples').fetchone()[0]\n"
        "try:\n    conn.execute('INSERT INTO host_samples (ts_ms) VALUES (99)'); wrote = 1\n"
        "except sqlite3.DatabaseError:\n    wrote = 0\n"
        "print(n, conn.frozen, wrote)\n"
    )

    live = run_as_nobody(read)  # the writer is open: -wal and -shm exist, read them read-only
    assert live.returncode == 0, live.stderr
    assert live.stdout.split() == ["5", "False", "0"]

    writer.insert("host_samples", [{"ts_ms": 10, "cpu_pct": 2.0}])
    writer.close()  # the last close checkpoints and removes -wal and -shm
    assert sorted(p.name for p in shared_dir.iterdir()) == ["gw.db"]
    after = run_as_nobody(read)
    assert after.returncode == 0, after.stderr
    assert after.stdout.split() == ["6", "True", "0"]


# --- the writer -------------------------------------------------------------------------------


def test_writer_batches_jobs_and_rolls_back_only_a_failing_one(tmp_path):
    writer = Writer(tmp_path / "gw.db")
    outcomes = {}
    writer.insert("host_samples", [{"ts_ms": 1, "cpu_pct": 1.0}], on_commit=lambda ok: outcomes.update(a=ok))
    writer.insert("host_samples", [{"ts_ms": 2}, {"ts_ms": 1}], on_commit=lambda ok: outcomes.update(b=ok))
    writer.submit(lambda conn: 1 / 0, lambda ok: outcomes.update(c=ok))  # a bug, not SQL
    writer.insert("host_samples", [{"ts_ms": 3}], on_commit=lambda ok: outcomes.update(d=ok))
    assert writer.flush(10)
    assert outcomes == {"a": True, "b": False, "c": False, "d": True}
    assert writer.failed_jobs == 2
    # the duplicate key rolled back the whole of job b, including its good row ts_ms=2
    assert [r[0] for r in writer.conn.execute("SELECT ts_ms FROM host_samples")] == [1, 3]
    writer.close()
    assert writer.submit(lambda conn: None) is None  # closed: refused, not blocked


def test_a_jobs_future_gives_its_value_or_its_exception_once_committed(tmp_path):
    writer = Writer(tmp_path / "gw.db")
    seen_by_reader = []

    def add(conn):
        conn.execute("INSERT INTO host_samples (ts_ms) VALUES (7)")
        return conn.execute("SELECT count(*) FROM host_samples").fetchone()[0]

    def refuse(conn):
        conn.execute("INSERT INTO host_samples (ts_ms) VALUES (8)")
        raise JobRefused("not this one") from KeyError("why")

    def read_when_resolved(future):
        seen_by_reader.extend(open_ro(tmp_path / "gw.db").execute("SELECT ts_ms FROM host_samples"))
        looked.set()

    looked = threading.Event()
    added = writer.submit(add)
    added.add_done_callback(read_when_resolved)
    refused = writer.submit(refuse)
    broken = writer.submit(lambda conn: conn.execute("INSERT INTO no_such_table VALUES (1)"))
    assert added.result(10) == 1
    assert looked.wait(10)
    assert seen_by_reader == [(7,)]  # resolved after COMMIT: another connection sees the row
    with pytest.raises(JobRefused, match="not this one") as refusal:
        refused.result(10)
    assert isinstance(refusal.value.__cause__, KeyError)
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        broken.result(10)
    assert [r[0] for r in writer.conn.execute("SELECT ts_ms FROM host_samples")] == [7]
    writer.close()


def test_a_batch_that_cannot_commit_fails_every_future_in_it(tmp_path, caplog):
    writer = Writer(tmp_path / "gw.db")
    started, release = threading.Event(), threading.Event()
    writer.submit(lambda conn: (started.set(), release.wait(10)))
    assert started.wait(10)
    good = writer.insert("host_samples", [{"ts_ms": 1}])

    def disk_error(conn):
        raise sqlite3.OperationalError("disk I/O error")  # what SQLite says when the disk fails

    bad = writer.submit(disk_error)
    release.set()  # both queued: one batch
    for future in (good, bad):
        with pytest.raises(StoreFailed, match=r"cannot write .*gw\.db: disk I/O error") as failed:
            future.result(10)
        assert isinstance(failed.value.__cause__, sqlite3.OperationalError)
    assert writer.conn.execute("SELECT count(*) FROM host_samples").fetchone()[0] == 0
    writer.close()


def test_a_future_cancelled_while_queued_is_not_run(tmp_path):
    writer = Writer(tmp_path / "gw.db")
    started, release = threading.Event(), threading.Event()
    writer.submit(lambda conn: (started.set(), release.wait(10)))
    assert started.wait(10)
    taken_back = writer.insert("host_samples", [{"ts_ms": 1}])
    kept = writer.insert("host_samples", [{"ts_ms": 2}])
    assert taken_back.cancel()
    release.set()
    assert kept.result(10) is None
    assert [r[0] for r in writer.conn.execute("SELECT ts_ms FROM host_samples")] == [2]
    writer.close()


def test_full_queue_refuses_without_blocking_and_counts_drops(tmp_path):
    writer = Writer(tmp_path / "gw.db", maxsize=2)
    started, release = threading.Event(), threading.Event()
    writer.submit(lambda conn: (started.set(), release.wait(10)))
    assert started.wait(10)  # the writer thread is busy with the first job
    assert writer.insert("host_samples", [{"ts_ms": 1}])
    assert writer.insert("host_samples", [{"ts_ms": 2}])
    assert writer.insert("host_samples", [{"ts_ms": 3}], block=False) is None
    assert writer.submit(lambda conn: None, timeout=0.05) is None
    assert writer.dropped_jobs == 2
    release.set()
    assert writer.flush(10)
    assert [r[0] for r in writer.conn.execute("SELECT ts_ms FROM host_samples")] == [1, 2]
    writer.close()


CHILD_WRITER = """
import sys
from gpuwatch.store import Writer
w = Writer(sys.argv[1], batch=50)
def committed(ts):
    def report(ok):
        if ok:
            sys.stdout.write(f"{ts}\\n"); sys.stdout.flush()
    return report
ts = 0
while True:
    ts += 1
    procs = [{"gpu_index": g, "pid": p, "ts_ms": ts, "used_mem_bytes": 2**30 + p,
              "sm_util_pct": p % 100} for g in range(8) for p in range(25)]
    w.insert("gpu_process_samples", procs)
    w.insert("host_samples", [{"ts_ms": ts, "cpu_pct": 1.0, "mem_used_bytes": ts}],
             on_commit=committed(ts))
"""


def test_sigkill_mid_write_loses_nothing_acknowledged(tmp_path):
    path = tmp_path / "gw.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    acknowledged = []
    try:
        for line in child.stdout:
            acknowledged.append(int(line))
            if len(acknowledged) >= 150:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    acknowledged += [int(line) for line in child.stdout.read().split()]
    assert child.returncode == -signal.SIGKILL
    conn = open_rw(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {r[0] for r in conn.execute("SELECT ts_ms FROM host_samples")}
    assert set(acknowledged) <= stored
    # each host sample's batch also held its tick's process samples, all or nothing
    full = conn.execute(
        "SELECT count(*) FROM (SELECT ts_ms FROM gpu_process_samples GROUP BY ts_ms HAVING count(*) = 200)"
    ).fetchone()[0]
    assert full >= len(acknowledged)
    conn.close()


# --- read queries -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,table",
    [
        (queries.GpuInfo, "gpus"),
        (queries.GpuSample, "gpu_samples"),
        (queries.HostSample, "host_samples"),
        (queries.StepRow, "steps"),
        (queries.Run, "runs"),
    ],
)
def test_dataclasses_carry_every_column(db, cls, table):
    columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
    names = [f.name for f in dataclasses.fields(cls)]
    assert names[: len(columns)] == columns


def test_latest_samples_and_processes_with_user_and_run(db):
    insert_rows(
        db,
        "gpus",
        [
            {"gpu_index": g, "uuid": f"GPU-{g}", "name": "H100", "first_seen_ms": 0, "last_seen_ms": 100_000}
            for g in range(2)
        ],
    )
    insert_rows(
        db,
        "gpu_samples",
        [
            {"gpu_index": g, "ts_ms": t, "gpu_util_pct": t // 1000 + g}
            for g in range(2)
            for t in (90_000, 100_000)
        ],
    )
    insert_rows(
        db,
        "gpu_process_samples",
        [
            {"gpu_index": 0, "pid": 12, "ts_ms": 90_000, "used_mem_bytes": 5},  # gone by the newest tick
            {"gpu_index": 0, "pid": 10, "ts_ms": 100_000, "used_mem_bytes": 2**30},
            {"gpu_index": 0, "pid": 11, "ts_ms": 100_000, "used_mem_bytes": 2**31},
            {"gpu_index": 1, "pid": 13, "ts_ms": 30_000, "used_mem_bytes": 7},  # GPU 1 idle since
        ],
    )
    insert_rows(
        db,
        "processes",
        [
            {
                "pid": 10,
                "start_ms": 1,
                "uid": 1000,
                "user": "old",
                "cmdline": "reused pid",
                "first_seen_ms": 1,
                "last_seen_ms": 2,
            },
            {
                "pid": 10,
                "start_ms": 50_000,
                "uid": 1001,
                "user": "alice",
                "cmdline": "python train.py",
                "run_id": "r-alice",
                "first_seen_ms": 50_000,
                "last_seen_ms": 100_000,
            },
        ],
    )
    insert_rows(
        db,
        "runs",
        [
            {"run_id": "r-alice", "name": "llama", "uid": 1001, "started_ms": 50_000, "status": "running"},
            {
                "run_id": "r-bob-old",
                "name": "x",
                "uid": 1002,
                "pid": 11,
                "started_ms": 1,
                "status": "finished",
            },
            {"run_id": "r-bob", "name": "mistral", "uid": 1002, "pid": 11, "started_ms": 60_000},
        ],
    )
    latest = queries.latest_gpu_samples(db)
    assert {g: (s.ts_ms, s.gpu_util_pct) for g, s in latest.items()} == {0: (100_000, 100), 1: (100_000, 101)}
    procs = queries.gpu_processes(db)
    assert [(p.gpu_index, p.pid, p.user, p.cmdline, p.run_id, p.run_name) for p in procs] == [
        (0, 11, None, None, "r-bob", "mistral"),  # biggest first; run found by pid
        (0, 10, "alice", "python train.py", "r-alice", "llama"),
    ]
    assert [g.uuid for g in queries.gpus(db)] == ["GPU-0", "GPU-1"]


def test_latest_host_sample(db):
    assert queries.latest_host_sample(db) is None
    insert_rows(db, "host_samples", [{"ts_ms": t, "cpu_pct": float(t)} for t in (5, 9, 7)])
    assert queries.latest_host_sample(db).cpu_pct == 9.0


def test_series_rejects_unknown_metric(db):
    with pytest.raises(StoreError, match="unknown GPU metric 'gpu_util; DROP TABLE runs'"):
        queries.gpu_series(db, 0, "gpu_util; DROP TABLE runs", 0, 10)
    with pytest.raises(StoreError, match="unknown host metric 'nope'"):
        queries.host_series(db, "nope", 0, 10)


def test_raw_series_is_downsampled_to_max_points(db):
    insert_rows(db, "host_samples", [{"ts_ms": 1000 * i, "cpu_pct": float(i % 10)} for i in range(600)])
    points = queries.host_series(db, "cpu_pct", 0, 600_000, max_points=60)
    assert len(points) == 60
    assert [p.ts_ms for p in points[:2]] == [0, 10_000]
    assert all((p.min, p.avg, p.max) == (0.0, 4.5, 9.0) for p in points)


def _add_runs(db):
    insert_rows(
        db,
        "runs",
        [
            {
                "run_id": "run-a1",
                "name": "alpha",
                "uid": 1,
                "user": "ann",
                "started_ms": 1_000,
                "status": "finished",
                "ended_ms": 20_000,
                "config_json": json.dumps({"lr": 0.1}),
            },
            {
                "run_id": "run-b2",
                "name": "beta",
                "uid": 2,
                "user": "bob",
                "started_ms": 2_000,
                "status": "failed",
                "ended_ms": 5_000,
                "config_json": "{not json",
            },
            {"run_id": "run-c3", "name": "alpha", "uid": 1, "user": "ann", "started_ms": 3_000},
            {
                "run_id": "zzz",
                "name": "run-a",
                "uid": 1,
                "user": "ann",
                "started_ms": 500,
                "status": "oom",
                "ended_ms": 900,
            },
        ],
    )
    # run-a1: 1000 tokens per 500 ms step -> 2000 tokens/s; the newest step says 2100
    insert_rows(
        db,
        "steps",
        [
            {
                "run_id": "run-a1",
                "step": s,
                "ts_ms": 1_000 + 500 * s,
                "tokens": 1000,
                "step_time_ms": 500.0,
                "tokens_per_s": 2100.0 if s == 3 else 1900.0,
                "mem_peak_bytes": [1, 3, 2][s - 1] * 2**30,
                "rss_bytes": 2 * 2**30,
            }
            for s in (1, 2, 3)
        ],
    )
    # run-b2: no step times -> 600 tokens over 3 s of wall time since start = 200 tokens/s
    insert_rows(
        db,
        "steps",
        [
            {"run_id": "run-b2", "step": s, "ts_ms": 2_000 + 1000 * s, "tokens": 200, "rss_bytes": 5 * 2**30}
            for s in (1, 2, 3)
        ],
    )
    insert_rows(db, "oom_postmortems", [{"run_id": "run-b2", "ts_ms": 5_000, "kind": "gpu"}])


def test_runs_aggregate_steps(db):
    _add_runs(db)
    by_id = {r.run_id: r for r in queries.runs(db)}
    assert [r.run_id for r in queries.runs(db)] == ["run-c3", "run-b2", "run-a1", "zzz"]
    a, b, c = by_id["run-a1"], by_id["run-b2"], by_id["run-c3"]
    assert (a.steps, a.tokens_per_s_avg, a.tokens_per_s_last, a.peak_mem_bytes, a.oom) == (
        3,
        pytest.approx(2000.0),
        2100.0,
        3 * 2**30,
        False,
    )
    assert (b.steps, b.tokens_per_s_avg, b.tokens_per_s_last, b.peak_mem_bytes, b.oom) == (
        3,
        pytest.approx(200.0),
        None,
        5 * 2**30,
        True,
    )  # oom from its postmortem
    assert (c.steps, c.tokens_per_s_avg, c.peak_mem_bytes, c.oom, c.status) == (
        0,
        None,
        None,
        False,
        "running",
    )
    assert by_id["zzz"].oom is True  # oom from its status


def test_runs_of_generation_only_report_decode_tokens_per_second(db):
    insert_rows(db, "runs", [{"run_id": "gen-1", "name": "decode", "uid": 1, "started_ms": 1_000}])
    # 100 tokens at 1000/s (0.1 s) and 300 tokens at 100/s (3 s): 400 tokens in 3.1 s
    insert_rows(
        db,
        "generations",
        [
            {"run_id": "gen-1", "gen_id": 1, "ts_ms": 2_000, "new_tokens": 100, "tokens_per_s": 1000.0},
            {"run_id": "gen-1", "gen_id": 2, "ts_ms": 3_000, "new_tokens": 300, "tokens_per_s": 100.0},
        ],
    )
    (summary,) = queries.runs(db)
    assert summary.steps == 0
    assert summary.tokens_per_s_avg == pytest.approx(400 / 3.1)
    assert summary.tokens_per_s_last == 100.0


def test_runs_filters(db):
    _add_runs(db)
    assert [r.run_id for r in queries.runs(db, user="bob")] == ["run-b2"]
    assert [r.run_id for r in queries.runs(db, status="running")] == ["run-c3"]
    assert [r.run_id for r in queries.runs(db, since_ms=10_000)] == ["run-c3", "run-a1"]
    assert [r.run_id for r in queries.runs(db, limit=2)] == ["run-c3", "run-b2"]


def test_run_by_id_name_and_prefix(db):
    _add_runs(db)
    assert queries.run(db, "run-a1").config == {"lr": 0.1}
    assert queries.run(db, "run-b2").config == {}  # config_json that is not JSON
    assert queries.run(db, "alpha").run_id == "run-c3"  # newest run with that name
    assert queries.run(db, "run-a").run_id == "zzz"  # an exact name beats an id prefix
    assert queries.run(db, "run-b").run_id == "run-b2"  # unique prefix
    assert queries.run(db, "zz").run_id == "zzz"
    with pytest.raises(StoreError, match=r"^'run-' matches 3 runs: run-c3, run-b2, run-a1$"):
        queries.run(db, "run-")
    with pytest.raises(StoreError, match=r"^no run matches 'nope'$"):
        queries.run(db, "nope")


def test_steps_in_order_and_limit_keeps_newest(db):
    _add_runs(db)
    assert [s.step for s in queries.steps(db, "run-a1")] == [1, 2, 3]
    assert [s.step for s in queries.steps(db, "run-a1", limit=2)] == [2, 3]
    assert [s.step for s in queries.steps(db, "run-b2", since_ms=4_000)] == [2, 3]
    assert queries.steps(db, "run-a1")[0].tokens == 1000


def test_runs_is_one_query_for_a_thousand_runs(db):
    insert_rows(db, "runs", [{"run_id": f"r{i:04d}", "uid": 1, "started_ms": i} for i in range(1000)])
    insert_rows(
        db,
        "steps",
        [
            {"run_id": f"r{i:04d}", "step": s, "ts_ms": i + s, "tokens": 10, "step_time_ms": 10.0}
            for i in range(1000)
            for s in range(5)
        ],
    )
    statements = []
    db.set_trace_callback(statements.append)
    result = queries.runs(db, limit=1000)
    db.set_trace_callback(None)
    assert len(result) == 1000 and all(r.steps == 5 for r in result)
    assert len(statements) == 1


def test_store_imports_neither_textual_nor_torch():
    code = (
        "import sys, gpuwatch.store, gpuwatch.store.queries, gpuwatch.store.maintenance\n"
        "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""The CLI through its real entry point: help everywhere, --version, query, status."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import sqlite3
import subprocess
import threading
from pathlib import Path

import fake_pynvml
import pytest
from systools import wait_for

from gpuwatch.base.config import Config
from gpuwatch.cli import COMMANDS
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer

GPUWATCH = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpuwatch"


def gw(*args, timeout=60):
    return subprocess.run([str(GPUWATCH), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def db(tmp_path):
    """A database with three host samples of known values."""
    path = str(tmp_path / "gw.db")
    w = Writer(path)
    w.insert(
        "host_samples",
        [
            {
                "ts_ms": 1000 + i,
                "cpu_pct": 10.5 * i,
                "load1": 0.5,
                "mem_total_bytes": 8 << 30,
                "mem_used_bytes": (i + 1) << 30,
            }
            for i in range(3)
        ],
    )
    w.close()
    return path


def test_version():
    from gpuwatch import __version__

    result = gw("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"gpuwatch, version {__version__}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_text(name):
    result = gw(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: gpuwatch {name}")
    description = result.stdout.split("\n\n")[1].strip()
    assert len(description) > 20, f"{name} has no help text"


def test_top_level_help_lists_every_command():
    result = gw("--help")
    assert result.returncode == 0
    for name in COMMANDS:
        assert f"  {name} " in result.stdout


# --- query ---


def test_query_table_fits_80_columns(db):
    result = gw(
        "query", "SELECT ts_ms, cpu_pct, mem_used_bytes, load1 FROM host_samples ORDER BY ts_ms", "--db", db
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["ts_ms", "cpu_pct", "mem_used_bytes", "load1"]
    assert lines[3].split() == ["1002", "21", "3221225472", "0.5"]
    assert all(len(line) <= 80 for line in lines)
    assert "(3 rows)" in result.stderr


def test_query_wide_rows_are_cut_to_80_columns(db):
    result = gw(
        "query", "SELECT *, 'a long text column that would never fit' AS note FROM host_samples", "--db", db
    )
    assert result.returncode == 0, result.stderr
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    assert "…" in result.stdout or "-[ row 1 ]" in result.stdout
    assert "a long text column" in result.stdout


def test_query_csv_and_json(db):
    result = gw(
        "query", "SELECT ts_ms, cpu_pct FROM host_samples ORDER BY ts_ms", "--db", db, "--format", "csv"
    )
    assert list(csv.reader(io.StringIO(result.stdout))) == [
        ["ts_ms", "cpu_pct"],
        ["1000", "0.0"],
        ["1001", "10.5"],
        ["1002", "21.0"],
    ]
    result = gw(
        "query", "SELECT ts_ms, cpu_pct FROM host_samples ORDER BY ts_ms", "--db", db, "--format", "json"
    )
    assert json.loads(result.stdout) == [
        {"ts_ms": 1000, "cpu_pct": 0.0},
        {"ts_ms": 1001, "cpu_pct": 10.5},
        {"ts_ms": 1002, "cpu_pct": 21.0},
    ]


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM host_samples",
        "UPDATE host_samples SET cpu_pct = 0",
        "DROP TABLE host_samples",
        "INSERT INTO host_samples (ts_ms) VALUES (5)",
        "PRAGMA user_version = 99",
    ],
)
def test_query_refuses_writes_with_one_line_and_changes_nothing(db, sql):
    before = sqlite3.connect(db).execute("SELECT * FROM host_samples").fetchall()
    result = gw("query", sql, "--db", db)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: query is read-only: only SELECT, WITH and PRAGMA reads run; nothing was changed"
    ]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT * FROM host_samples").fetchall() == before
    assert conn.execute("PRAGMA user_version").fetchone()[0] != 99


def test_query_reads_json_with_table_valued_functions(db):
    """json_each is how postmortem neighbours are queried; the read-only guard must allow it."""
    result = gw(
        "query", "SELECT sum(value) AS total FROM json_each('[1, 2, 39]')", "--db", db, "--format", "json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [{"total": 42}]
    refused = gw("query", "UPDATE sqlite_master SET name = 'x'", "--db", db)  # SQLite itself refuses
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert sqlite3.connect(db).execute("SELECT count(*) FROM host_samples").fetchone() == (3,)


def test_query_attach_cannot_create_files(db, tmp_path):
    result = gw("query", f"ATTACH '{tmp_path}/new.db' AS x", "--db", db)
    assert result.returncode == 1 and not (tmp_path / "new.db").exists()


def test_query_bad_sql_and_missing_db_are_one_line(db, tmp_path):
    result = gw("query", "SELECT * FROM no_such_table", "--db", db)
    assert result.returncode == 1
    assert result.stderr.strip() == "Error: query failed: no such table: no_such_table"
    result = gw("query", "SELECT 1", "--db", str(tmp_path / "absent.db"))
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "no such database" in result.stderr
    assert not (tmp_path / "absent.db").exists()


# --- status ---


def test_status_without_daemon_or_driver_says_so_and_shows_the_host(tmp_path):
    result = gw("status", "--db", str(tmp_path / "none.db"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "no daemon: sampled now"
    assert lines[1].startswith("no NVIDIA driver: ")
    assert lines[2].startswith("host: CPU ") and " RAM " in lines[2] and "/dev/shm" in lines[2]


def test_status_reads_a_daemon_database_while_it_is_fresh(tmp_path):
    path = str(tmp_path / "live.db")
    writer = Writer(path)
    nvml = fake_pynvml.FakeNvml(gpus=8, procs={2: [1]})  # pid 1 exists: it has a user and a command
    sampler = Sampler(writer, Config(), nvml_module=nvml)
    sampler.gpu_tick()
    sampler.host_tick()
    writer.close()
    result = gw("status", "--db", path)
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert out[0].startswith("daemon data, ") and out[0].endswith(" old")
    gpu_rows = [line for line in out if "(simulated)" in line]
    assert [row.split()[0] for row in gpu_rows] == [str(i) for i in range(8)]
    assert all("80.0 GiB" in row and row.rstrip().endswith("ok") for row in gpu_rows)
    assert any(line.startswith("host: CPU ") for line in out)
    procs = out[[line.split()[:1] for line in out].index(["pid"]) + 1 :]
    assert len(procs) == 1 and procs[0].split()[0] == "1" and procs[0].split()[2] == "2"
    assert all(len(line) <= 80 for line in out)


def test_status_samples_directly_when_the_database_is_stale(db):
    result = gw("status", "--db", db)  # its newest sample is from 1970
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "no daemon: sampled now"


def test_status_live_redraws_until_ctrl_c(tmp_path):
    proc = subprocess.Popen(
        [str(GPUWATCH), "status", "--live", "--db", str(tmp_path / "none.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GPUWATCH_INTERVAL": "0.3"},
        # a shell's background job ignores SIGINT, and its children inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:  # until it has drawn twice, however long a loaded machine takes to start it
        wait_for(lambda: "".join(seen).count("no daemon: sampled now") >= 2, timeout=60)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    reader.join(10)
    assert proc.returncode == 0, proc.stderr.read()


def test_daemon_that_cannot_open_its_database_says_why_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = gw("daemon", "--user", "--db", str(blocker / "gw.db"), "--socket", str(tmp_path / "s.sock"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("<3>")]
    assert len(errors) == 1 and "cannot start" in errors[0] and str(blocker) in errors[0], result.stderr


def test_daemon_whose_socket_cannot_be_made_exits_1_with_an_intact_database(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    db = tmp_path / "gw.db"
    result = gw("daemon", "--user", "--db", str(db), "--socket", str(blocker / "s.sock"))
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("<3>")]
    assert len(errors) == 1 and str(blocker) in errors[0], result.stderr
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)

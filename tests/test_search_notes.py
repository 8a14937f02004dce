"""Full-text search over runs and notes (sqlite-utils FTS, kept by triggers), `gpuwatch note`
and its ownership rule, through the user's own database and through a real daemon."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from test_profiling import _db_rows, _env, daemon  # noqa: F401 (a fixture)

from gpuwatch.cli import main
from gpuwatch.store import open_rw
from gpuwatch.store.events import Peer, apply_events
from gpuwatch.store.schema import MIGRATIONS, SCHEMA_VERSION

ME = os.getuid()


def _run(conn, run_id, uid=ME, **cols):
    row = {"run_id": run_id, "uid": uid, "started_ms": cols.pop("started_ms", 1000), **cols}
    conn.execute(
        f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", tuple(row.values())
    )


def _ids(db, *args) -> list[str]:
    result = CliRunner().invoke(main, ["runs", "--db", str(db), "--format", "json", *args])
    assert result.exit_code == 0, result.output
    return [r["run_id"] for r in json.loads(result.output)]


@pytest.fixture
def sweep(tmp_path):
    db = tmp_path / "gw.db"
    conn = open_rw(db)
    _run(
        conn,
        "run-a",
        name="sweep-a",
        command="python train.py --lr 3e-4 --seq-len 4096",
        git_commit="a3f9c2e81b",
        config_json=json.dumps({"lr": 3e-4, "opt": "adamw"}),
        started_ms=1,
    )
    _run(
        conn,
        "run-b",
        name="sweep-b",
        command="python train.py --lr=1e-3 --seq-len 4096",
        git_commit="77d0b1aa90",
        started_ms=2,
    )
    conn.close()
    return db


def test_search_finds_runs_by_command_value_commit_prefix_and_config(sweep):
    assert _ids(sweep, "--search", "lr=3e-4") == ["run-a"]
    assert _ids(sweep, "--search", "--lr=1e-3") == ["run-b"]
    assert _ids(sweep, "--search", "a3f9c") == ["run-a"]
    assert _ids(sweep, "--search", "adamw") == ["run-a"]
    assert _ids(sweep, "--search", "seq-len 4096") == ["run-b", "run-a"]
    assert _ids(sweep, "--search", "sweep nosuchword") == []


def test_the_index_follows_renames_and_deletes_but_not_step_updates(sweep):
    conn = open_rw(sweep)
    conn.execute("UPDATE runs SET name = 'baseline' WHERE run_id = 'run-b'")
    conn.execute("DELETE FROM runs WHERE run_id = 'run-a'")
    conn.execute("UPDATE runs SET last_step_ms = 99 WHERE run_id = 'run-b'")
    conn.close()
    assert _ids(sweep, "--search", "baseline") == ["run-b"]
    assert _ids(sweep, "--search", "sweep") == []
    assert _ids(sweep, "--search", "a3f9c") == []


def test_an_old_database_gets_its_existing_runs_indexed(tmp_path):
    db = tmp_path / "old.db"
    before = MIGRATIONS.index(next(m for m in MIGRATIONS if callable(m) and m.__name__ == "add_search"))
    old = sqlite3.connect(db)
    old.executescript(f"BEGIN; {' '.join(MIGRATIONS[:before])} PRAGMA user_version = {before}; COMMIT;")
    old.execute(
        "INSERT INTO runs (run_id, uid, started_ms, command) VALUES ('old', 0, 1, 'python old.py --lr 5e-5')"
    )
    old.commit()
    old.close()
    open_rw(db).close()  # migrates
    assert _db_rows(db, "PRAGMA user_version")[0][0] == SCHEMA_VERSION
    assert _ids(db, "--search", "lr=5e-5") == ["old"]


def test_a_note_is_shown_and_searchable(sweep):
    result = CliRunner().invoke(main, ["note", "sweep-b", "diverged", "after", "warmup", "--db", str(sweep)])
    assert result.exit_code == 0, result.output
    assert _ids(sweep, "--search", "diverged warmup") == ["run-b"]
    shown = CliRunner().invoke(main, ["show", "run-b", "--db", str(sweep)]).output
    assert "notes" in shown and "diverged after warmup" in shown


def test_only_the_owner_or_root_may_note_a_run(sweep):
    conn = open_rw(sweep)
    _run(conn, "theirs", uid=4242, started_ms=3)
    event = {"id": "n1", "kind": "note", "run_id": "theirs", "ts_ms": 5, "text": "mine now"}
    outcome = apply_events(conn, [event], Peer(1000, "someone", 1, "daemon"))
    assert outcome.rejected and outcome.rejected[0][1] == "forbidden"
    assert apply_events(conn, [event], Peer(4242, "owner", 1, "daemon")).applied == ["n1"]
    assert apply_events(conn, [dict(event, id="n2", ts_ms=6)], Peer(0, "root", 1, "daemon")).applied == ["n2"]
    unknown = apply_events(conn, [dict(event, run_id="nope")], Peer(0, "root", 1, "daemon"))
    assert unknown.rejected[0][1] == "unknown_run"
    conn.close()
    assert [r[0] for r in _db_rows(sweep, "SELECT user FROM run_notes ORDER BY ts_ms")] == ["owner", "root"]


AS_USER = """
import json, os, pwd, socket, sys
# Everything imported first: the venv's files need not be readable by the other uid.
import gpuwatch.cli.note_cmd, gpuwatch.cli.profile_cmd, gpuwatch.client.transport, gpuwatch.store.events
import gpuwatch.base.config, gpuwatch.base.paths, gpuwatch.protocol, gpuwatch.store.queries, gpuwatch.store.search
from gpuwatch.cli import main
os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[1]))
if sys.argv[2] == "start":
    s = socket.socket(socket.AF_UNIX); s.connect(os.environ["GPUWATCH_SOCKET"]); f = s.makefile("rwb")
    for frame in ({"type": "hello"}, {"type": "events", "events": [{"id": "s", "kind": "run_start",
                  "run_id": sys.argv[3], "ts_ms": 1, "name": "nobody-run"}]}):
        f.write(json.dumps(dict(frame, v=1)).encode() + b"\\n"); f.flush(); print(f.readline().decode().strip())
else:
    sys.exit(main(["note", sys.argv[3], "--db", os.environ["TEST_DB_FILE"], "checked by", sys.argv[1]]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to other uids")
def test_notes_on_the_daemons_runs_go_through_the_daemon_as_the_caller(daemon, tmp_path):  # noqa: F811 (the fixture)
    db, sock = daemon
    env = _env(
        GPUWATCH_SOCKET=str(sock),
        TEST_DB_FILE=str(db),
        HOME="/tmp",
        GPUWATCH_CONFIG="/nonexistent/gpuwatch.toml",
        XDG_CONFIG_HOME="/nonexistent",
    )

    def as_user(uid: int, *args):
        return subprocess.run(
            [sys.executable, "-c", AS_USER, str(uid), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    started = as_user(65534, "start", "nobody-run-1")
    assert started.returncode == 0 and '"ack"' in started.stdout, started
    deadline = time.monotonic() + 10
    while not _db_rows(db, "SELECT 1 FROM runs WHERE run_id = 'nobody-run-1'"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    other = as_user(65533, "note", "nobody-run-1")
    assert other.returncode == 1 and "belongs to uid 65534" in other.stderr, other
    owner = as_user(65534, "note", "nobody-run-1")
    assert owner.returncode == 0, owner
    assert _db_rows(db, "SELECT uid, text FROM run_notes") == [(65534, "checked by 65534")]


def test_a_migration_function_may_transform_a_table_and_fails_whole(tmp_path, monkeypatch):
    """A change ALTER TABLE cannot make (a column's default, a NOT NULL) as a function entry of
    MIGRATIONS, through sqlite-utils' transform(), in the migration's transaction: applied with
    the rows kept, or, when it fails, not at all. (transform() rebuilds rowid tables only: it
    copies `rowid`, which a WITHOUT ROWID table has not.)"""
    import sqlite_utils

    from gpuwatch.store import db as db_mod

    path = tmp_path / "gw.db"
    conn = open_rw(path)
    conn.execute("INSERT INTO profiles (id, run_id, ts_ms, trigger) VALUES (1, 'r1', 5, 'on_demand')")
    conn.close()

    def trigger_default(c):
        sqlite_utils.Database(c)["profiles"].transform(defaults={"trigger": "scheduled"})

    def rank_not_null(c):
        sqlite_utils.Database(c)["profiles"].transform(not_null={"rank"})  # a NULL rank is there

    for step, expected in ((rank_not_null, SCHEMA_VERSION), (trigger_default, SCHEMA_VERSION + 1)):
        monkeypatch.setattr(db_mod, "MIGRATIONS", [*MIGRATIONS, step])
        monkeypatch.setattr(db_mod, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        try:
            open_rw(path).close()
        except Exception as e:
            assert step is rank_not_null and "NOT NULL" in str(e), e
        with sqlite3.connect(path) as plain:
            assert plain.execute("PRAGMA user_version").fetchone()[0] == expected
            assert plain.execute("SELECT id, run_id, trigger FROM profiles").fetchall() == [
                (1, "r1", "on_demand")
            ]
            sql = plain.execute("SELECT sql FROM sqlite_master WHERE name = 'profiles'").fetchone()[0]
            assert ("DEFAULT 'scheduled'" in sql) == (step is trigger_default)
            assert plain.execute("SELECT 1 FROM sqlite_master WHERE name = 'profiles_run'").fetchone()


def test_runs_keep_their_search_entries_through_a_vacuum(tmp_path):
    """The search index refers to runs by their integer key, which a VACUUM keeps."""
    from gpuwatch.store import insert_rows
    from gpuwatch.store.search import MATCHES, match_expression

    path = tmp_path / "v.db"
    conn = open_rw(path)
    insert_rows(
        conn, "runs", [{"run_id": f"r{i}", "name": f"name{i}", "uid": 0, "started_ms": i} for i in range(50)]
    )
    conn.execute("DELETE FROM runs WHERE run_id IN ('r0', 'r1', 'r2', 'r3')")
    conn.execute("VACUUM")
    query = match_expression("name42")
    found = conn.execute(f"SELECT run_id FROM runs WHERE {MATCHES}", (query, query)).fetchall()
    assert found == [("r42",)]
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO runs (run_id, uid, started_ms) VALUES ('r42', 0, 1)")
    conn.close()

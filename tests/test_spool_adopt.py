"""A run that ends while the daemon is away is stored complete once the daemon is back, though
its process is gone: the daemon adopts the spool file it left. Identity from the file's owner.

The daemon is a real child process (fake NVML); the run is a real `gpuwatch.track()` in another
child, as this uid (user mode) or, for system mode, as uid 65534 after a setuid in that child.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from systools import wait_for

from gpuwatch.base.config import Config
from gpuwatch.daemon.spool import SpoolAdopter
from gpuwatch.store import Writer

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
STEPS, HALF = 300, 90
NOBODY = 65534

DAEMON = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "spool_dir": sys.argv[3], "system": sys.argv[4] == "system",
            "interval": 0.5, "host_interval": 0.5, "spool_scan_interval": 0.3}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=1)))
"""

# Steps to HALF with the daemon there, waits for a line on stdin (the daemon is stopped
# meanwhile), then the rest and a clean end: with the daemon away, all of that is spooled.
CLIENT = f"""
import os, sys, time
import gpuwatch, gpuwatch.client.run, gpuwatch.client.transport  # before setuid: root's Python is 0700
uid = int(sys.argv[1])
if uid != os.getuid():
    os.setgid(uid); os.setgroups([]); os.setuid(uid)
with gpuwatch.track(name="tail") as run:
    for i in range({STEPS}):
        run.step(tokens=1000)
        time.sleep(0.002)  # below the transport's budget (1,000 steps/s): one event per step, none folded
        if i == {HALF}:
            run._transport.flush()
            print(run.run_id, flush=True)
            sys.stdin.readline()
"""


@pytest.fixture
def shared(tmp_path):
    """A directory every uid can reach (pytest's tmp_path is private to root)."""
    path = Path(f"/tmp/gw-spool-{os.getpid()}-{time.monotonic_ns()}")
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def rows(db, sql, *args):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def start_daemon(where: Path, mode: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            DAEMON,
            str(where / "gw.db"),
            str(where / "gw.sock"),
            str(where / "spool"),
            mode,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: (where / "gw.sock").exists())
    return proc


def stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    return stderr


def run_that_ends_while_the_daemon_is_away(
    where: Path, mode: str, uid: int, while_away=lambda env: None
) -> tuple[str, str]:
    """The daemon's log after its return, and the run's id; `while_away(env)` runs once the
    run has ended and before the daemon is back."""
    home = where / "home"
    home.mkdir(exist_ok=True)
    os.chown(home, uid, -1)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        GPUWATCH_SOCKET=str(where / "gw.sock"),
        GPUWATCH_SPOOL_DIR=str(where / "spool"),
        HOME=str(home),
        XDG_DATA_HOME=str(home / "data"),
        XDG_RUNTIME_DIR=str(home / "run"),
        GPUWATCH_CONFIG=str(home / "none.toml"),
    )
    daemon = start_daemon(where, mode)
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(uid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=home,
    )
    try:
        run_id = client.stdout.readline().strip()
        assert run_id, client.stderr.read()
        wait_for(lambda: rows(where / "gw.db", "SELECT count(*) FROM steps")[0][0] == HALF + 1)
        stop(daemon)  # an upgrade, a crash, the OOM killer
        client.communicate("go\n", timeout=60)  # the run goes on and ends with the daemon away
        assert client.returncode == 0
        assert list((where / "spool").glob("*.jsonl")), "nothing was spooled"
        assert rows(where / "gw.db", "SELECT count(*) FROM steps")[0][0] == HALF + 1
        while_away(env)
        daemon = start_daemon(where, mode)  # back, after the run's process is gone
        wait_for(
            lambda: (
                rows(where / "gw.db", "SELECT status FROM runs WHERE run_id = ?", run_id) == [("finished",)]
            )
        )
        wait_for(lambda: not list((where / "spool").glob("*.jsonl")))
        return stop(daemon), run_id
    finally:
        client.kill()
        daemon.kill()


def readers_say_events_wait(env: dict) -> None:
    from gpuwatch.selftest.doctor import Env, _Facts, check_daemon
    from gpuwatch.tui import panels
    from gpuwatch.tui.snapshot import View
    from gpuwatch.tui.source import StoreSource

    spool = Path(env["GPUWATCH_SPOOL_DIR"])
    status = subprocess.run(
        [str(REPO / ".venv" / "bin" / "gpuwatch"), "status", "--db", str(spool.parent / "gw.db")],
        capture_output=True,
        text=True,
        env=dict(env, COLUMNS="200"),
        timeout=60,
    )
    expected = f"{STEPS - HALF} events in 1 spool file ({spool}) wait"  # the steps left and the run's end
    assert expected in status.stdout, status.stdout + status.stderr
    snap = StoreSource(str(spool.parent / "gw.db"), spool_dirs=[spool]).fetch(View("overview"))
    assert expected in panels.status_line(snap)[0].plain
    checks = check_daemon(
        Env(
            socket_path=spool.parent / "gw.sock",
            db_path=spool.parent / "gw.db",
            spool_dir=spool,
            connect=lambda path: None,
        ),
        _Facts(),
    )
    assert [c.detail for c in checks if c.name == "spooled events"][0].startswith(expected)


def test_user_mode_run_ending_while_the_daemon_is_stopped_is_stored_complete_after_its_return(shared):
    log, run_id = run_that_ends_while_the_daemon_is_away(shared, "user", os.getuid(), readers_say_events_wait)
    db = shared / "gw.db"
    assert rows(db, "SELECT count(*), min(step), max(step) FROM steps WHERE run_id = ?", run_id) == [
        (STEPS, 1, STEPS)
    ]
    assert rows(db, "SELECT uid, status, ended_ms IS NOT NULL FROM runs") == [(os.getuid(), "finished", 1)]
    adopted = [line for line in log.splitlines() if "spool file" in line]
    assert len(adopted) == 1 and f"{STEPS - HALF}" in adopted[0] and "exited" in adopted[0], log


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root to setuid to")
def test_system_mode_run_of_another_uid_is_stored_as_that_uid(shared):
    log, run_id = run_that_ends_while_the_daemon_is_away(shared, "system", NOBODY)
    db = shared / "gw.db"
    assert rows(db, "SELECT count(*) FROM steps WHERE run_id = ?", run_id) == [(STEPS,)]
    assert rows(db, "SELECT uid, status FROM runs") == [(NOBODY, "finished")]
    assert (shared / "spool").stat().st_mode & 0o7777 == 0o1777  # anyone may add, none may remove others'
    assert "refused" not in log


PLANT = """
import json, os, sys
os.setgid(65534); os.setgroups([]); os.setuid(65534)
with open(sys.argv[1], "w") as f:  # events for root's run, in the shared spool
    f.write(json.dumps({"id": "evil-1", "kind": "step", "run_id": "victim", "ts_ms": 5, "step": 999}) + "\\n")
    f.write(json.dumps({"id": "evil-2", "kind": "run_end", "run_id": "victim", "ts_ms": 6, "status": "failed"}) + "\\n")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root to setuid to")
def test_a_spool_file_planted_by_another_uid_is_refused_and_logged_once(shared, caplog):
    caplog.set_level(logging.INFO, logger="gpuwatch.daemon.spool")
    spool = shared / "spool"
    writer = Writer(shared / "gw.db")
    writer.insert("runs", [dict(run_id="victim", uid=0, user="root", pid=1, status="running", started_ms=1)])
    writer.flush()
    try:
        # System mode: nobody's file acts as nobody, and nobody may not write to root's run.
        system = SpoolAdopter(Config(system=True, spool_dir=str(spool)), writer)
        system.prepare()
        subprocess.run([sys.executable, "-c", PLANT, str(spool / "999999-aaaa.jsonl")], check=True)
        assert system.scan() == 0
        # User mode: a file not of the daemon's own uid is not even read, however often it looks.
        user_spool = shared / "user-spool"
        user_spool.mkdir()
        user_spool.chmod(0o1777)  # as if the user's own spool were open to a planter
        subprocess.run([sys.executable, "-c", PLANT, str(user_spool / "999999-bbbb.jsonl")], check=True)
        user = SpoolAdopter(Config(system=False, spool_dir=str(user_spool)), writer)
        assert user.scan() == 0 and user.scan() == 0
        assert (user_spool / "999999-bbbb.jsonl").exists()
    finally:
        writer.close()
    conn = sqlite3.connect(shared / "gw.db")
    assert conn.execute("SELECT status FROM runs WHERE run_id = 'victim'").fetchall() == [("running",)]
    assert conn.execute("SELECT count(*) FROM steps").fetchone() == (0,)
    conn.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "2 events refused" in warnings[0] and "belongs to uid 0" in warnings[0]
    assert "refused: owned by uid 65534" in warnings[1]

"""Stall stacks: a real stalled child, a real py-spy dump, the stall watcher and `gpuwatch stacks`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from collectors import pyspy
from gpuwatch.alerts.stalled_runs import stall_threshold_s
from gpuwatch.base.config import Config
from gpuwatch.cli import main
from gpuwatch.daemon.stalls import StallWatch
from gpuwatch.store import Writer, open_ro, profiles

pytestmark = pytest.mark.skipif(pyspy.find_py_spy() is None, reason="py-spy is not installed")

STALLER = """
import time, gpuwatch

def waiting_for_a_batch_that_never_comes():
    time.sleep(120)

with gpuwatch.track(name="staller") as run:
    for _ in range(3):
        time.sleep(0.02)
        run.step(tokens=8)
    print(run.run_id, flush=True)
    waiting_for_a_batch_that_never_comes()
"""


@pytest.fixture
def staller(tmp_path):
    """A child tracking an embedded run: 3 quick steps, then a long sleep. Yields (db, run_id, pid)."""
    db = tmp_path / "gw.db"
    env = dict(os.environ, GPUWATCH_DB=str(db), PYTHONPATH=str(Path(__file__).parents[1]))
    proc = subprocess.Popen([sys.executable, "-c", STALLER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, "the child did not start its run"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the embedded writer commits the steps a moment later
            conn = open_ro(db)
            try:
                row = conn.execute("SELECT last_step_ms FROM runs WHERE run_id = ?", (run_id,)).fetchone()
                if row and row[0]:
                    break
            finally:
                conn.close()
            time.sleep(0.1)
        yield db, run_id, proc.pid
    finally:
        proc.kill()
        proc.wait()


def _stored_dumps(db: Path, run_id: str):
    conn = open_ro(db)
    try:
        return profiles.stack_dumps(conn, run_id)
    finally:
        conn.close()


def test_the_stall_watcher_stores_the_stacks_of_a_stalled_run_once_per_episode(staller):
    db, run_id, pid = staller
    cfg = Config(db=str(db), stall_floor=0.5, stall_factor=5.0)
    writer = Writer(db)
    watch = StallWatch(writer, cfg)
    try:
        dumped = []
        deadline = time.monotonic() + 30
        while not dumped and time.monotonic() < deadline:
            dumped = watch.check_once()
            time.sleep(0.2)
        assert dumped == [run_id]
        assert watch.check_once() == []  # the same episode is not dumped twice
        writer.flush(10)
    finally:
        writer.close()
    [dump] = _stored_dumps(db, run_id)
    assert (dump.reason, dump.pid, dump.error) == ("stall", pid, None)
    functions = [f["name"] for t in dump.threads for f in t["frames"]]
    assert "waiting_for_a_batch_that_never_comes" in functions


def test_a_run_that_keeps_stepping_is_not_stalled():
    cfg = Config(stall_floor=120.0, stall_factor=10.0)
    assert stall_threshold_s([20_000.0] * 9 + [90_000.0], cfg) == 200.0  # 10 x median 20 s
    assert stall_threshold_s([50.0] * 10, cfg) == 120.0  # the floor wins for fast steps
    assert stall_threshold_s([], cfg) == 120.0


def test_gpuwatch_stacks_without_a_daemon_dumps_directly_and_keeps_the_dump(staller):
    db, run_id, pid = staller
    result = CliRunner().invoke(main, ["stacks", run_id, "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert f"pid {pid}" in result.output
    assert "in waiting_for_a_batch_that_never_comes" in result.output
    [dump] = _stored_dumps(db, run_id)
    assert dump.reason == "on_demand"
    again = CliRunner().invoke(main, ["stacks", run_id, "--db", str(db), "--last"])
    assert "waiting_for_a_batch_that_never_comes" in again.output


def test_ptrace_scope_3_is_explained(tmp_path):
    scope = tmp_path / "ptrace_scope"
    scope.write_text("3\n")
    problem = pyspy.ptrace_problem(os.getpid(), scope_path=scope)
    assert "ptrace_scope=3" in problem and "reboot" in problem


def test_stacks_of_a_finished_run_point_at_the_stored_ones(tmp_path):
    db = tmp_path / "gw.db"
    env = dict(os.environ, GPUWATCH_DB=str(db))
    out = subprocess.run(
        [sys.executable, "-c", "import gpuwatch\nwith gpuwatch.track() as r: print(r.run_id)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result = CliRunner().invoke(main, ["stacks", out, "--db", str(db)])
    assert result.exit_code == 1
    assert f"run {out} is finished: no process to dump" in result.output


DAEMON = """
import sys
from gpuwatch.base.config import Config
from gpuwatch.daemon.main import run_daemon
sys.exit(run_daemon(Config(db=sys.argv[1], socket=sys.argv[2], system=False, interval=5.0,
                           host_interval=5.0, process_interval=30.0, stall_floor=1.0, stall_factor=5.0)))
"""


def test_the_daemon_dumps_a_stalled_run_by_itself_and_on_demand(monkeypatch):
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="gws-", dir="/tmp"))  # short: socket paths are capped
    db, sock = base / "gw.db", base / "gw.sock"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    daemon = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(db), str(sock)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    child = None
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert daemon.poll() is None, daemon.stderr.read().decode()
            assert time.monotonic() < deadline, "the daemon did not listen in time"
            time.sleep(0.05)
        child = subprocess.Popen(
            [sys.executable, "-c", STALLER],
            env=dict(env, GPUWATCH_SOCKET=str(sock)),
            stdout=subprocess.PIPE,
            text=True,
        )
        run_id = child.stdout.readline().strip()
        deadline = time.monotonic() + 30
        while not _stored_dumps(db, run_id):  # the stall watcher's, after ~1 s of silence
            assert time.monotonic() < deadline, "the daemon stored no stall dump"
            time.sleep(0.2)
        [stall] = _stored_dumps(db, run_id)
        assert stall.reason == "stall" and "waiting_for_a_batch_that_never_comes" in stall.stacks_json

        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        result = CliRunner().invoke(main, ["stacks", run_id, "--db", str(db)])
        assert result.exit_code == 0, result.output
        assert f"pid {child.pid}" in result.output and "(on demand)" in result.output
        assert "in waiting_for_a_batch_that_never_comes" in result.output
        deadline = time.monotonic() + 10
        while len(_stored_dumps(db, run_id)) < 2:
            assert time.monotonic() < deadline, "the on-demand dump was not stored"
            time.sleep(0.1)
    finally:
        if child is not None:
            child.kill()
            child.wait()
        daemon.terminate()
        daemon.wait(10)
        shutil.rmtree(base, ignore_errors=True)

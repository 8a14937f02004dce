"""Readers with the daemon away: `gpuwatch tui` on a fresh install samples in its own process,
and an open TUI or `status --live` rides over a daemon restart, saying so while it is away."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from systools import needs_tools
from test_tui_terminal import Tmux
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

TESTS = Path(__file__).resolve().parent
GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
INTERVAL = 0.2

DAEMON = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "interval": {INTERVAL}, "host_interval": {INTERVAL},
            "system": False}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=2)))
"""


@needs_tools("tmux")
def test_tui_with_no_daemon_and_no_database_samples_itself_and_says_history_starts_now(tmp_path):
    child = subprocess.Popen(["sleep", "60"])
    db = tmp_path / "data" / "gpuwatch" / "gpuwatch.db"
    env = (
        f"PYTHONPATH={TESTS / 'fake_driver'}:{os.environ.get('PYTHONPATH', '')} FAKE_NVML_GPUS=4 "
        f"FAKE_NVML_PIDS={child.pid} XDG_DATA_HOME={tmp_path / 'data'} "
        f"XDG_RUNTIME_DIR={os.environ['XDG_RUNTIME_DIR']} GPUWATCH_CONFIG={tmp_path / 'none.toml'}"
    )
    tmux = Tmux(f"gwtest-nd-{os.getpid()}")
    assert not db.exists()
    try:
        tmux("new-session", "-d", "-s", "tui", "-x", "80", "-y", "24", f"{env} exec {GPUWATCH} tui")
        screen = tmux.wait_for("no daemon: history starts now", "install-service", "GPU processes: 1")
        # Every GPU (simulated) and the process on one, at 80 columns.
        assert sum("°C" in line for line in screen.splitlines()) == 4, screen
        assert str(child.pid) in screen
        tmux("send-keys", "-t", "tui", "q")
        deadline = time.monotonic() + 10
        while subprocess.run(tmux.base + ["has-session", "-t", "tui"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "q did not quit"
            time.sleep(0.1)
    finally:
        subprocess.run(tmux.base + ["kill-server"], capture_output=True)
        child.kill()
        child.wait()
    # What it sampled stays in the per-user database: history starts there.
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(DISTINCT gpu_index) FROM gpu_samples").fetchone() == (4,)
        assert conn.execute("SELECT count(*) FROM host_samples").fetchone()[0] >= 1
    finally:
        conn.close()


def _has_samples(db: str) -> bool:
    try:
        conn = sqlite3.connect(db)
        try:
            return conn.execute("SELECT count(*) FROM host_samples").fetchone()[0] > 0
        finally:
            conn.close()
    except sqlite3.OperationalError:  # no schema yet
        return False


def _start_daemon(db: str, sock: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", DAEMON, db, sock], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


async def _status_becomes(pilot, words: str, timeout: float = 20.0) -> str:
    from gpuwatch.tui.screens.base import StatusLine

    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        await pilot.pause(0.1)
        text = pilot.app.screen.query_one("#status", StatusLine).text.plain
        if words in text:
            return text
    raise AssertionError(f"status line never said {words!r}; it says {text!r}")


@pilot_test
async def test_open_tui_says_daemon_away_during_a_restart_and_goes_live_again_by_itself(tmp_path):
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.source import StoreSource

    db, sock = str(tmp_path / "gw.db"), str(tmp_path / "gw.sock")
    daemon = _start_daemon(db, sock)
    try:
        deadline = time.monotonic() + 20
        while not _has_samples(db) and time.monotonic() < deadline:
            time.sleep(0.05)
        app = GpuwatchApp(StoreSource(db, stale_after_ms=int(3000 * INTERVAL)), refresh_s=INTERVAL)
        async with app.run_test(size=(80, 24)) as pilot:
            await _status_becomes(pilot, "live")
            daemon.send_signal(signal.SIGTERM)  # systemctl restart: stop ...
            daemon.communicate(timeout=20)
            away = await _status_becomes(pilot, "daemon not running")
            assert "live again by itself" in away
            daemon = _start_daemon(db, sock)  # ... and start
            await _status_becomes(pilot, "live")
            assert app.export_screenshot().count("°C") == 2  # both GPUs, with fresh figures
    finally:
        daemon.kill()
        daemon.communicate(timeout=20)


def test_status_live_says_daemon_away_during_a_restart_and_reads_it_again_by_itself(tmp_path):
    import queue
    import threading

    db, sock = str(tmp_path / "gw.db"), str(tmp_path / "gw.sock")
    daemon = _start_daemon(db, sock)
    live = None
    try:
        deadline = time.monotonic() + 20
        while not _has_samples(db) and time.monotonic() < deadline:
            time.sleep(0.05)
        live = subprocess.Popen(
            [GPUWATCH, "status", "--live", "--db", db],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, GPUWATCH_INTERVAL=str(INTERVAL), GPUWATCH_HOST_INTERVAL=str(INTERVAL)),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in live.stdout], daemon=True).start()

        def shows(words: str) -> str:
            end = time.monotonic() + 20
            while time.monotonic() < end:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    continue
                if line.startswith(words):
                    return line
            raise AssertionError(f"status --live never said {words!r}")

        shows("daemon data, ")
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=20)
        assert "live again by itself" in shows("daemon not writing: its data is ")
        daemon = _start_daemon(db, sock)
        shows("daemon data, ")
    finally:
        if live is not None:
            live.send_signal(signal.SIGINT)
            live.wait(20)
        daemon.kill()
        daemon.communicate(timeout=20)
    assert live.returncode == 0

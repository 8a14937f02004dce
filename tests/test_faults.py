"""Faults of a real GPU server, driven through the real daemon: a GPU whose NVML calls hang.

The daemon runs as a child process on the fake NVML (tests/fake_pynvml.py); what a user would
see is read back with `gpuwatch status`, /metrics and the log lines on stderr.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from systools import wait_for

from collectors import nvml as nvml_collector
from gpuwatch.selftest.doctor import Env, check_daemon
from gpuwatch.tui.snapshot import View
from gpuwatch.tui.source import StoreSource

TESTS = Path(__file__).resolve().parent
PYTHON = sys.executable
GPUWATCH = TESTS.parent / ".venv" / "bin" / "gpuwatch"
INTERVAL = 0.2
HUNG_GPU = 3

# GPU 3's calls block from second 1.5; SIGUSR1 lets them return (the GPU answers again).
HUNG_RUNNER = f"""
import signal, sys
sys.path.insert(0, {str(TESTS)!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
nvml = fake_pynvml.FakeNvml(gpus=8, hang={{{HUNG_GPU}: 1.5}})
signal.signal(signal.SIGUSR1, lambda *_: nvml.set_hung({HUNG_GPU}, False))
cfg = load({{"db": sys.argv[1], "socket": sys.argv[2], "interval": {INTERVAL},
            "host_interval": {INTERVAL}, "system": False, "metrics_listen": sys.argv[3]}})
sys.exit(run_daemon(cfg, nvml_module=nvml))
"""


def rows(db, sql, *args):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []  # the daemon has not made the schema yet
    finally:
        conn.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_hung_gpu_is_shown_not_responding_while_the_others_and_the_host_keep_their_cadence(tmp_path):
    import urllib.request

    db, port = str(tmp_path / "gw.db"), free_port()
    proc = subprocess.Popen(
        [PYTHON, "-c", HUNG_RUNNER, db, str(tmp_path / "gw.sock"), f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        hung = wait_for(
            lambda: (
                rows(
                    db, "SELECT min(ts_ms) FROM gpu_samples WHERE gpu_index = ? AND state = 'hung'", HUNG_GPU
                )[0][0]
                if rows(db, "SELECT 1 FROM gpu_samples WHERE state = 'hung'")
                else None
            )
        )
        last_ok = rows(
            db, "SELECT max(ts_ms) FROM gpu_samples WHERE gpu_index = ? AND state IS NULL", HUNG_GPU
        )[0][0]
        # Shown within 3 intervals of its last answer: the tick that found it hung is the next.
        assert hung - last_ok <= 3 * INTERVAL * 1000
        time.sleep(10 * INTERVAL)  # ten more ticks with GPU 3 hung
        status = subprocess.run(
            [str(GPUWATCH), "status", "--db", db],
            capture_output=True,
            text=True,
            timeout=30,
            env=dict(os.environ, COLUMNS="160"),
        )
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        overview = StoreSource(db).fetch(View("overview"))
        doctor = {
            c.name: c
            for c in check_daemon(
                Env(socket_path=tmp_path / "gw.sock", db_path=Path(db), connect=lambda path: None), None
            )
        }
        proc.send_signal(signal.SIGUSR1)  # the GPU recovers
        wait_for(
            lambda: rows(
                db,
                "SELECT 1 FROM gpu_samples WHERE gpu_index = ? AND state IS NULL AND ts_ms > ?",
                HUNG_GPU,
                hung,
            )
        )
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr

    line = next(line for line in status.stdout.splitlines() if line.strip().startswith(f"{HUNG_GPU} "))
    assert "not responding since" in line, status.stdout
    assert sum("not responding" in line for line in status.stdout.splitlines()) == 1
    # The TUI's overview and the doctor say the same.
    assert [g.index for g in overview.gpus if g.problems()] == [HUNG_GPU]
    assert overview.gpus[HUNG_GPU].problems()[0].startswith("NOT RESPONDING since ")
    assert doctor["GPUs answering"].status == "fail"
    assert doctor["GPUs answering"].detail.startswith(f"GPU {HUNG_GPU} not responding since ")
    up = [m for m in metrics.splitlines() if m.startswith("gpuwatch_gpu_up{")]
    assert len(up) == 8
    assert [m for m in up if m.endswith(" 0.0")] == [
        m for m in up if f'gpu="{HUNG_GPU}"' in m and 'reason="not responding"' in m
    ]

    # The other GPUs and the host lost nothing: one sample each per tick, no gap in the cadence.
    host = [ts for (ts,) in rows(db, "SELECT ts_ms FROM host_samples ORDER BY ts_ms")]
    for gpu in set(range(8)) - {HUNG_GPU}:
        ticks = [
            ts
            for (ts,) in rows(
                db, "SELECT ts_ms FROM gpu_samples WHERE gpu_index = ? AND state IS NULL ORDER BY ts_ms", gpu
            )
        ]
        assert ticks == host
    # No tick waited for GPU 3: that one would come a read deadline (1 s) late, and the ticks would
    # be a sixth of the cadence's. A loaded machine may starve the sampler of a tick now and then
    # (skipped, not bunched: two of 22 at load 4), hung GPU or not.
    gaps = [b - a for a, b in zip(host, host[1:])]
    assert max(gaps) < nvml_collector.DEADLINE_S * 1000, gaps
    assert len(host) >= 0.8 * (host[-1] - host[0]) / (INTERVAL * 1000), gaps

    # One warning when it starts, one when it ends; nothing else about it, no traceback.
    about = [line for line in stderr.splitlines() if f"GPU {HUNG_GPU}" in line]
    assert len(about) == 2 and all(line.startswith("<4>") for line in about), stderr
    assert "not responding" in about[0] and "answers again" in about[1]
    assert "Traceback" not in stderr


def test_the_watchdog_is_fed_while_a_gpu_hangs(tmp_path, monkeypatch):
    import asyncio
    import socket
    import threading

    import fake_pynvml

    from collectors import nvml as nvml_mod
    from gpuwatch.base.config import Config
    from gpuwatch.daemon.main import Daemon
    from gpuwatch.daemon.notify import Notifier

    path = f"/tmp/gw-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    # Hung from the start: NVML's start waits INIT_DEADLINE_S (10 s) for its facts; 0.3 s here.
    monkeypatch.setattr(nvml_mod, "INIT_DEADLINE_S", 0.3)
    nvml = fake_pynvml.FakeNvml(gpus=2, hang={1: 0.0})
    daemon = Daemon(
        Config(
            db=str(tmp_path / "gw.db"),
            socket=str(tmp_path / "s.sock"),
            interval=0.1,
            host_interval=0.1,
            system=False,
        ),
        nvml_module=nvml,
        notifier=Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}),
    )
    thread = threading.Thread(target=lambda: asyncio.run(daemon.serve()))
    thread.start()
    try:
        sock.settimeout(10)
        got = []
        deadline = time.monotonic() + 15
        while sum(m == "WATCHDOG=1" for m in got) < 10 and time.monotonic() < deadline:
            got += sock.recv(4096).decode().split("\n")
        assert sum(m == "WATCHDOG=1" for m in got) >= 10  # ~1 s of pings with GPU 1 hung
        assert "STATUS=sampler stalled" not in got
    finally:
        nvml.set_hung(1, False)
        daemon.request_stop()
        thread.join(10)
        sock.close()
        os.unlink(path)
    assert not thread.is_alive()


def test_doctor_says_nvml_hangs_instead_of_hanging(monkeypatch):
    import fake_pynvml

    from gpuwatch.selftest import doctor

    monkeypatch.setattr(doctor, "NVML_DEADLINE_S", 0.3)
    nvml = fake_pynvml.FakeNvml(gpus=2, hang={1: 0.0})
    try:
        checks = doctor.check_nvml(doctor.Env(nvml=lambda: nvml), doctor._Facts())
    finally:
        nvml.set_hung(1, False)
    assert [(c.status, c.detail) for c in checks] == [
        ("fail", "NVML did not answer within 0.3 s: a GPU or the driver hangs")
    ]


def test_a_gpu_hung_from_the_start_is_read_once_it_answers(monkeypatch, caplog):
    import logging

    import fake_pynvml

    from collectors import nvml as nvml_mod

    caplog.set_level(logging.WARNING, logger="collectors.nvml")
    monkeypatch.setattr(nvml_mod, "INIT_DEADLINE_S", 0.3)
    fake = fake_pynvml.FakeNvml(gpus=3, hang={1: 0.0})
    started = time.monotonic()
    collector = nvml_mod.NvmlCollector(fake, deadline_s=0.1)
    assert time.monotonic() - started < 5  # start-up does not wait for the hung GPU
    assert [s.uuid != "" for s in collector.static] == [True, False, True]
    samples, _ = collector.sample(1000)
    assert [s.state for s in samples] == [None, "hung", None]
    assert collector.not_responding_since(1) is not None
    fake.set_hung(1, False)
    deadline = time.monotonic() + 10
    while collector.sample(2000)[0][1].state == "hung":  # its worker returns, then it is read again
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert collector.static[1].uuid.startswith("GPU-") and collector.not_responding_since(1) is None
    collector.close()
    messages = [r.getMessage() for r in caplog.records]
    assert (
        len(messages) == 2
        and "GPU 1 is not responding" in messages[0]
        and "GPU 1 answers again" in messages[1]
    )


def _nvml_threads(before: set) -> list[str]:
    """The names of the GPU reading threads started since `before` (other tests' may linger)."""
    import threading

    return sorted(
        t.name for t in set(threading.enumerate()) - before if t.name.startswith("gpuwatch-nvml-gpu")
    )


def test_the_answering_gpus_share_one_thread_and_a_hung_one_costs_them_no_tick(caplog):
    import logging
    import threading

    import fake_pynvml

    from collectors import nvml as nvml_mod

    caplog.set_level(logging.WARNING, logger="collectors.nvml")
    fake = fake_pynvml.FakeNvml(gpus=4, procs_per_gpu=1)
    before = set(threading.enumerate())
    collector = nvml_mod.NvmlCollector(fake, deadline_s=0.1)
    try:
        collector.sample(1000)
        # One thread reads the four GPUs in turn (the per-GPU threads of the start have ended).
        wait_for(lambda: _nvml_threads(before) == ["gpuwatch-nvml-gpus"], timeout=10)
        fake.set_hung(1)
        samples, procs = collector.sample(2000)
        # The round that found GPU 1 blocked still read the GPUs after it, at this tick's time.
        assert [(s.gpu_index, s.ts_ms, s.state) for s in samples] == [
            (0, 2000, None),
            (1, 2000, "hung"),
            (2, 2000, None),
            (3, 2000, None),
        ]
        assert sorted(p.gpu_index for p in procs) == [0, 2, 3]
        assert [s.state for s in collector.sample(3000)[0]] == [None, "hung", None, None]
        fake.set_hung(1, False)
        deadline = time.monotonic() + 10
        while collector.sample(4000)[0][1].state == "hung":  # its call returns, then it is read again
            assert time.monotonic() < deadline
            time.sleep(0.05)
        collector.sample(5000)
        wait_for(lambda: _nvml_threads(before) == ["gpuwatch-nvml-gpus"], timeout=10)  # back in the pool
    finally:
        fake.set_hung(1, False)
        collector.close()
    about = [r.getMessage() for r in caplog.records]
    assert len(about) == 2 and "GPU 1 is not responding" in about[0] and "GPU 1 answers again" in about[1]


def test_gpus_too_slow_to_read_in_turn_are_read_side_by_side(monkeypatch, caplog):
    import logging
    import threading

    import fake_pynvml

    from collectors import nvml as nvml_mod

    caplog.set_level(logging.WARNING, logger="collectors.nvml")
    monkeypatch.setattr(nvml_mod, "POOL_MAX_SHARE", 0.0)  # any round in turn is too slow
    before = set(threading.enumerate())
    collector = nvml_mod.NvmlCollector(fake_pynvml.FakeNvml(gpus=3), deadline_s=0.1)
    try:
        assert [s.state for s in collector.sample(1000)[0]] == [None, None, None]
        assert not collector.pooled and "each is read in a thread of its own" in caplog.text
        samples, _ = collector.sample(2000)
        assert [(s.gpu_index, s.state) for s in samples] == [(0, None), (1, None), (2, None)]
        wait_for(lambda: _nvml_threads(before) == [f"gpuwatch-nvml-gpu{i}" for i in range(3)], timeout=10)
    finally:
        collector.close()

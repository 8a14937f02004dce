"""The sampler and the daemon, with real ticks into a real SQLite file.

GPUs come from the fake pynvml (8 simulated GPUs), handed in as a module: in-process to
Sampler/Daemon, and in a `python -c` child for the subprocess tests, so no fake ships in the
product. The host-only tests use the real pynvml, which finds no driver here.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import fake_pynvml
import pytest
from systools import wait_for

from collectors.nvml import NvmlCollector
from gpuwatch.base.config import Config, load
from gpuwatch.daemon.main import Daemon
from gpuwatch.daemon.notify import Notifier
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer, now_ms, queries

TESTS = Path(__file__).resolve().parent
PYTHON = sys.executable
GPUWATCH = TESTS.parent / ".venv" / "bin" / "gpuwatch"

RUNNER = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import fake_pynvml
from gpuwatch.base.config import load
from gpuwatch.daemon import logging as daemon_logging
from gpuwatch.daemon.main import run_daemon
daemon_logging.setup()
interval = float(sys.argv[2])
cfg = load({{"db": sys.argv[1], "interval": interval, "host_interval": interval, "system": False}})
sys.exit(run_daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8)))
"""


def rows(db, sql, *args):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def count_when_ready(db, table) -> int:
    """Rows in table, 0 while the daemon has not created the database and schema yet."""
    try:
        return rows(db, f"SELECT count(*) FROM {table}")[0][0] if Path(db).exists() else 0
    except sqlite3.OperationalError:
        return 0


def sleeper() -> subprocess.Popen:
    """`sleep 30`, once the kernel counts its resident memory: just after exec the RSS in
    /proc/PID/stat can still read 0 (per-thread counters not yet folded in)."""
    child = subprocess.Popen(["sleep", "30"])
    wait_for(lambda: int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[21]) > 0)
    return child


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "gw.db")


@pytest.fixture
def writer(db):
    w = Writer(db)
    yield w
    w.close()


@pytest.fixture
def notify_socket():
    """A real datagram socket bound as systemd's notification socket would be."""
    path = f"/tmp/gw-notify-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    yield path, sock
    sock.close()
    os.unlink(path)


def receive(sock, want: str, timeout=15.0) -> list[tuple[float, str]]:
    """Datagrams (arrival time, text) up to and including the first containing `want`."""
    got = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            data = sock.recv(4096).decode()
        except socket.timeout:
            break
        got.append((time.monotonic(), data))
        if want in data.split("\n"):
            return got
    raise AssertionError(f"{want} never arrived; got {[d for _, d in got]}")


# --- sampler, ticked by hand ---


class Clock:
    """An injected clock: ms for the Sampler, seconds for the fake NVML; moved by hand."""

    def __init__(self, start_ms: int = 1_700_000_000_000):
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms

    def seconds(self) -> float:
        return self.ms / 1000


def test_gpu_and_host_ticks_write_every_table(writer, db):
    clock = Clock()
    nvml = fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=1, clock=clock.seconds)
    sampler = Sampler(writer, Config(), nvml_module=nvml, clock=clock)
    assert sampler.gpu_available and sampler.gpu_count == 8
    for _ in range(3):
        sampler.gpu_tick()
        sampler.host_tick()
        clock.ms += 1000
    writer.flush()
    gpus = rows(db, "SELECT gpu_index, name, state, first_seen_ms <= last_seen_ms FROM gpus ORDER BY 1")
    assert [g[0] for g in gpus] == list(range(8))
    assert all(g[1].endswith("(simulated)") and g[2] == "ok" and g[3] for g in gpus)
    per_gpu = rows(db, "SELECT gpu_index, count(*), min(gpu_util_pct) >= 0 FROM gpu_samples GROUP BY 1")
    assert per_gpu == [(i, 3, 1) for i in range(8)]
    # Same processes all along: one process tick (every process_interval, 5 s), all GPUs.
    assert rows(
        db, "SELECT count(*), count(DISTINCT gpu_index), count(DISTINCT ts_ms) FROM gpu_process_samples"
    ) == [(8, 8, 1)]
    assert rows(db, "SELECT count(*), min(mem_total_bytes) > 0 FROM host_samples") == [(3, 1)]
    stats = rows(db, "SELECT rss_bytes, tick_ms, db_bytes FROM daemon_stats")  # one per 30 s
    assert len(stats) == 1 and all(r[0] > 1_000_000 and r[1] > 0 and r[2] > 0 for r in stats)


def test_process_samples_every_process_interval_at_once_on_change_and_tui_finds_them(writer, db):
    children = [sleeper() for _ in range(3)]
    a, b, c = (child.pid for child in children)
    try:
        clock = Clock()
        nvml = fake_pynvml.FakeNvml(gpus=2, procs={0: [a], 1: [b]}, clock=clock.seconds)
        # The same fake GPUs read by a second collector: the per-tick values to average.
        twin = NvmlCollector(fake_pynvml.FakeNvml(gpus=2, procs={0: [a], 1: [b]}, clock=clock.seconds))
        sampler = Sampler(writer, Config(process_interval=5.0), nvml_module=nvml, clock=clock)
        t0 = clock.ms
        per_tick = []
        for second in range(6):  # 0..5 s: written at 0 s, then at 5 s
            clock.ms = t0 + second * 1000
            sampler.gpu_tick()
            per_tick.append({p.pid: p.sm_util_pct for p in twin.sample(clock.ms)[1]})
        writer.flush()
        ticks = rows(db, "SELECT DISTINCT ts_ms FROM gpu_process_samples ORDER BY 1")
        assert ticks == [(t0,), (t0 + 5000,)]
        written = dict(
            rows(db, "SELECT pid, sm_util_pct FROM gpu_process_samples WHERE ts_ms = ?", t0 + 5000)
        )
        # sm util is the mean over the ticks since the previous write (1..5 s), not the last tick.
        assert written == {pid: round(sum(t[pid] for t in per_tick[1:]) / 5) for pid in (a, b)}
        assert rows(db, "SELECT count(kind), min(rss_bytes) > 0 FROM gpu_process_samples") == [(0, 1)]

        clock.ms = t0 + 6000  # a process starts on GPU 1: written at once, both GPUs
        nvml.set_procs(1, [b, c])
        sampler.gpu_tick()
        clock.ms = t0 + 7000  # GPU 0's process leaves: written at once
        nvml.set_procs(0, [])
        sampler.gpu_tick()
        for second in (8, 9, 10):  # GPU ticks go on; the process tick stays at 7 s
            clock.ms = t0 + second * 1000
            sampler.gpu_tick()
        writer.flush()
        assert rows(
            db,
            "SELECT ts_ms - ?, gpu_index, pid FROM gpu_process_samples WHERE ts_ms > ? ORDER BY 1, 2, 3",
            t0,
            t0 + 5000,
        ) == [
            (6000, 0, a),
            (6000, 1, min(b, c)),
            (6000, 1, max(b, c)),
            (7000, 1, min(b, c)),
            (7000, 1, max(b, c)),
        ]
        with sqlite3.connect(db) as conn:
            shown = queries.gpu_processes(conn)
        # What the TUI's process table shows at 10 s: GPU 1's two processes, none on GPU 0.
        assert sorted((p.gpu_index, p.pid, p.kind) for p in shown) == sorted(
            [(1, b, "compute"), (1, c, "compute")]
        )
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_process_table_empties_when_process_ticks_stop_while_gpu_ticks_go_on(writer, db):
    clock = Clock()
    nvml = fake_pynvml.FakeNvml(gpus=1, procs_per_gpu=2, clock=clock.seconds)
    sampler = Sampler(writer, Config(), nvml_module=nvml, clock=clock)
    sampler.gpu_tick()
    nvml.set_procs(0, [])  # the last process on the machine leaves: no process row says so
    for _ in range(20):
        clock.ms += 1000
        sampler.gpu_tick()
        writer.flush()
        with sqlite3.connect(db) as conn:
            if not queries.gpu_processes(conn):
                break
    assert clock.ms - Clock().ms <= queries.PROCESS_TICK_SLACK_MS + 1000


def test_daemon_stats_every_30_s_with_cpu_over_the_window(writer, db):
    clock = Clock()
    sampler = Sampler(
        writer, Config(), nvml_module=fake_pynvml.FakeNvml(gpus=1, clock=clock.seconds), clock=clock
    )
    t0 = clock.ms
    for _ in range(61):
        sampler.gpu_tick()
        clock.ms += 1000
    writer.flush()
    stats = rows(db, "SELECT ts_ms - ?, cpu_pct >= 0, rss_bytes > 0 FROM daemon_stats ORDER BY 1", t0)
    assert stats == [(0, 1, 1), (30_000, 1, 1), (60_000, 1, 1)]


def test_a_wall_clock_step_back_does_not_stop_process_samples(writer, db):
    clock = Clock()
    sampler = Sampler(
        writer,
        Config(),
        nvml_module=fake_pynvml.FakeNvml(gpus=1, procs_per_gpu=1, clock=clock.seconds),
        clock=clock,
    )
    sampler.gpu_tick()
    clock.ms -= 3_600_000  # NTP steps the clock back an hour
    sampler.gpu_tick()
    writer.flush()
    assert rows(db, "SELECT count(DISTINCT ts_ms) FROM gpu_process_samples") == [(2,)]


def test_lost_gpu_changes_its_row_while_the_others_keep_sampling(writer, db):
    nvml = fake_pynvml.FakeNvml(gpus=8)
    sampler = Sampler(writer, Config(), nvml_module=nvml)
    sampler.gpu_tick()
    nvml.set_lost(3)
    time.sleep(0.002)
    sampler.gpu_tick()
    writer.flush()
    assert rows(db, "SELECT gpu_index FROM gpus WHERE state = 'lost'") == [(3,)]
    latest = rows(
        db,
        "SELECT gpu_index, state, gpu_util_pct FROM gpu_samples "
        "WHERE ts_ms = (SELECT max(ts_ms) FROM gpu_samples) ORDER BY 1",
    )
    assert latest[3] == (3, "lost", None)
    assert all(r[1] is None and r[2] is not None for i, r in enumerate(latest) if i != 3)


def test_gpu_process_of_a_run_child_gets_the_run_id_rss_and_cpu(writer, db):
    child = sleeper()
    try:
        nvml = fake_pynvml.FakeNvml(gpus=2, procs={1: [child.pid]})
        sampler = Sampler(writer, Config(process_interval=0.001), nvml_module=nvml)
        # This test process plays `gpuwatch run`: a running run whose pid is the GPU pid's parent.
        writer.insert(
            "runs",
            [
                {
                    "run_id": "r-wrapper",
                    "uid": os.getuid(),
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started_ms": now_ms(),
                }
            ],
        )
        sampler.refresh_runs()
        writer.flush()
        sampler.gpu_tick()
        writer.flush()
        assert rows(db, "SELECT run_id, user, cmdline FROM processes WHERE pid = ?", child.pid) == [
            ("r-wrapper", "root" if os.getuid() == 0 else os.environ.get("USER"), "sleep 30")
        ]
        time.sleep(0.01)
        sampler.gpu_tick()  # the second tick has a CPU % baseline
        writer.flush()
        usage = rows(
            db, "SELECT rss_bytes, cpu_pct FROM gpu_process_samples WHERE pid = ? ORDER BY ts_ms", child.pid
        )
        assert len(usage) == 2 and all(rss > 1000 for rss, _ in usage) and usage[1][1] is not None
        # The run finishes: the link already recorded stays, later ticks add none.
        writer.submit(lambda c: c.execute("UPDATE runs SET status = 'finished'"))
        sampler.refresh_runs()
        writer.flush()
        writer.submit(lambda c: c.execute("UPDATE processes SET run_id = NULL"))
        time.sleep(0.01)
        sampler.gpu_tick()
        writer.flush()
        assert rows(db, "SELECT run_id FROM processes WHERE pid = ?", child.pid) == [(None,)]
    finally:
        child.kill()
        child.wait()


def test_maintenance_tick_rolls_up_and_expires_old_samples_in_the_writer(writer, db):
    sampler = Sampler(writer, Config(raw_retention_hours=1.0), nvml_module=fake_pynvml.FakeNvml(gpus=1))
    two_hours_ago = now_ms() - 2 * 3_600_000
    period = two_hours_ago - two_hours_ago % 900_000
    writer.insert(
        "gpu_samples",
        [{"gpu_index": 0, "ts_ms": period + i * 1000, "gpu_util_pct": u} for i, u in enumerate((10, 20, 60))],
    )
    sampler.gpu_tick()
    sampler.maintenance_tick()
    writer.flush()
    assert rows(
        db,
        "SELECT gpu_util_pct_min, gpu_util_pct_avg, gpu_util_pct_max, n FROM gpu_samples_15m "
        "WHERE gpu_index = 0 AND ts_ms = ?",
        period,
    ) == [(10, 30.0, 60, 3)]
    assert rows(db, "SELECT count(*) FROM gpu_samples WHERE ts_ms < ?", now_ms() - 3_600_000) == [(0,)]
    assert rows(db, "SELECT count(*) FROM gpu_samples")[0][0] == 1  # the fresh tick stays


def test_no_driver_means_host_only_and_one_log_line(writer, db, caplog):
    caplog.set_level(logging.INFO)
    nvml = fake_pynvml.FakeNvml(init_error="DriverNotLoaded")
    sampler = Sampler(writer, Config(), nvml_module=nvml)
    assert not sampler.gpu_available
    assert "Driver" in sampler.nvml_error or "driver" in sampler.nvml_error
    assert [j.name for j in sampler.sched.jobs if j.name == "gpu"] == []
    sampler.host_tick()
    sampler.host_tick()
    writer.flush()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "host only" in warnings[0].getMessage()
    assert rows(db, "SELECT count(*) FROM gpu_samples") == [(0,)]
    assert rows(db, "SELECT count(*) FROM host_samples")[0][0] >= 1
    assert sampler.status_line().startswith("host only: ")


def test_started_sampler_ticks_on_its_own_and_stop_flushes(writer, db):
    sampler = Sampler(
        writer, Config(interval=0.1, host_interval=0.1), nvml_module=fake_pynvml.FakeNvml(gpus=8)
    )
    sampler.start()
    time.sleep(0.55)
    sampler.stop()
    n = rows(db, "SELECT count(*) FROM gpu_samples WHERE gpu_index = 0")[0][0]
    assert 4 <= n <= 7
    # Equal intervals: one job samples both, so every host sample has its GPU tick's ts_ms.
    assert [j.name for j in sampler.sched.jobs][0] == "gpu+host"
    assert rows(
        db, "SELECT count(*) FROM host_samples h JOIN gpu_samples g ON g.gpu_index = 0 AND g.ts_ms = h.ts_ms"
    ) == [(n,)]
    assert not sampler.healthy()


def test_different_gpu_and_host_intervals_are_separate_jobs(writer):
    sampler = Sampler(
        writer, Config(interval=1.0, host_interval=5.0), nvml_module=fake_pynvml.FakeNvml(gpus=1)
    )
    assert {j.name: j.interval for j in sampler.sched.jobs if j.name in ("gpu", "host")} == {
        "gpu": 1.0,
        "host": 5.0,
    }


# --- sd_notify ---


def test_notifier_reaches_abstract_sockets_and_is_silent_without_one():
    name = f"gw-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "4000000"})
        assert notifier.ready("sampling 8 GPUs\nevery 1s")
        assert sock.recv(4096) == b"READY=1\nSTATUS=sampling 8 GPUs every 1s"
        assert notifier.watchdog_interval_s == 2.0
    finally:
        sock.close()
    silent = Notifier({})
    assert not silent.enabled and not silent.ready("x") and silent.watchdog_interval_s == 0
    other = Notifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval_s == 0  # the watchdog is meant for another process


# --- the daemon, in-process ---


def test_daemon_in_a_thread_samples_and_stops_the_watchdog_when_the_sampler_dies(db, notify_socket):
    path, sock = notify_socket
    cfg = Config(db=db, interval=0.1, host_interval=0.1)
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})  # feed every 0.1 s
    daemon = Daemon(cfg, nvml_module=fake_pynvml.FakeNvml(gpus=8), notifier=notifier)
    thread = threading.Thread(target=lambda: __import__("asyncio").run(daemon.serve()))
    thread.start()
    try:
        ready = receive(sock, "READY=1")
        assert "STATUS=sampling 8 GPUs every 0.1s; db " + db in ready[-1][1]
        receive(sock, "WATCHDOG=1")
        daemon.sampler.sched.stop()  # the sampling thread is gone: the watchdog must starve
        receive(sock, "STATUS=sampler stalled")
        sock.settimeout(0.6)
        with pytest.raises(socket.timeout):
            print(sock.recv(4096))
    finally:
        daemon.request_stop()
        thread.join(10)
    assert not thread.is_alive()
    assert rows(db, "SELECT count(DISTINCT gpu_index) FROM gpu_samples") == [(8,)]


# --- the daemon, as a real process ---


def start_runner(db, interval, env=None):
    return subprocess.Popen(
        [PYTHON, "-c", RUNNER, db, str(interval)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_daemon_process_ready_watchdog_period_and_sigterm_exit_0(db, notify_socket):
    path, sock = notify_socket
    env = dict(os.environ, NOTIFY_SOCKET=path, WATCHDOG_USEC="1000000")  # WATCHDOG=1 every 0.5 s
    proc = start_runner(db, 0.2, env)
    try:
        ready = receive(sock, "READY=1")
        assert "STATUS=sampling 8 GPUs" in ready[-1][1]
        pings = [receive(sock, "WATCHDOG=1")[-1][0] for _ in range(4)]
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert all(0.3 < g < 1.2 for g in gaps), gaps  # 0.5 s, with room for a busy machine
        proc.send_signal(signal.SIGTERM)
        receive(sock, "STOPPING=1")
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    lines = stderr.strip().splitlines()
    assert lines and all(line[:3] in ("<6>", "<4>", "<3>") for line in lines), lines
    assert not any(line[3:7].isdigit() for line in lines)  # no timestamps: journald adds them
    assert rows(db, "SELECT count(DISTINCT gpu_index) FROM gpu_samples") == [(8,)]
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]


def test_sigkill_mid_write_leaves_an_intact_database_with_samples(db):
    proc = start_runner(db, 0.02)
    try:
        wait_for(lambda: count_when_ready(db, "gpu_samples") >= 400)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=20)
    assert proc.returncode == -signal.SIGKILL
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert rows(db, "SELECT count(*) FROM gpu_samples")[0][0] >= 400
    assert rows(db, "SELECT count(*) FROM host_samples")[0][0] >= 1


def test_gpuwatch_daemon_without_driver_runs_host_only_and_says_so_once(db, tmp_path):
    proc = subprocess.Popen(
        [
            str(GPUWATCH),
            "daemon",
            "--db",
            db,
            "--user",
            "--interval",
            "0.2",
            "--socket",
            str(tmp_path / "s.sock"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: count_when_ready(db, "host_samples") >= 2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    host_only = [line for line in stderr.splitlines() if "host only" in line]
    assert len(host_only) == 1 and host_only[0].startswith("<4>"), stderr
    assert rows(db, "SELECT count(*) FROM gpu_samples") == [(0,)]


def test_daemon_mode_default_and_flags():
    from gpuwatch.daemon.main import default_system_mode, resolve_mode

    assert default_system_mode({"STATE_DIRECTORY": "/var/lib/gpuwatch"})
    assert default_system_mode({}) == (os.geteuid() == 0)
    assert resolve_mode(load({"system": False})).system is False  # an explicit --user wins
    assert resolve_mode(load({"system": True})).system is True


def test_processes_last_seen_is_refreshed_while_the_process_stays(writer, db):
    child = subprocess.Popen(["sleep", "30"])
    try:
        clock = Clock()
        nvml = fake_pynvml.FakeNvml(gpus=1, procs={0: [child.pid]}, clock=clock.seconds)
        sampler = Sampler(writer, Config(), nvml_module=nvml, clock=clock)
        for _ in range(21):
            sampler.gpu_tick()
            clock.ms += 1000
        writer.flush()
        assert rows(db, "SELECT last_seen_ms - first_seen_ms FROM processes WHERE pid = ?", child.pid) == [
            (20_000,)
        ]
    finally:
        child.kill()
        child.wait()

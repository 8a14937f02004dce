"""Alert rules on a real daemon over the fake NVML: every kind is written once per incident, and
a restarted daemon neither repeats nor loses one.

The daemon runs in a thread of this process (so the test can steer the fake driver); runs are
real child processes talking to it over its socket (`gpuwatch run`, gpuwatch.track()).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import fake_pynvml
import pytest
from click.testing import CliRunner
from systools import wait_for

from collectors.nvml import GpuSample, GpuStatic
from gpuwatch.alerts import rules as rules_mod
from gpuwatch.base.config import Config
from gpuwatch.daemon.main import Daemon
from gpuwatch.monitor import sampler as sampler_mod
from gpuwatch.store import alerts as stored
from gpuwatch.store import open_rw

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
GPUWATCH = [str(Path(PYTHON).parent / "gpuwatch")]
IDLE_GPU, LOST_GPU, HUNG_GPU, SICK_GPU = 0, 1, 2, 3  # GPUs 4-7 stay free

STALLER = """
import time, gpuwatch
def waiting_for_a_batch_that_never_comes():
    time.sleep(4)
with gpuwatch.track(name="staller") as run:
    for _ in range(3):
        time.sleep(0.05)
        run.step(tokens=8)
    print(run.run_id, flush=True)
    waiting_for_a_batch_that_never_comes()
    run.step(tokens=8)  # it recovers, and ends
"""
OOMER = """
import gpuwatch
with gpuwatch.track(name="oomer") as run:
    run.step(tokens=8)
    raise MemoryError("simulated: the host has no memory left")
"""


def rows(db, sql, *args):
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def kinds(db) -> dict[str, int]:
    return dict(rows(db, "SELECT kind, count(*) FROM alerts GROUP BY kind"))


class DaemonThread:
    def __init__(self, cfg: Config, nvml):
        self.daemon = Daemon(cfg, nvml_module=nvml)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.daemon.serve()), daemon=True)
        self.thread.start()
        wait_for(lambda: self.daemon.loop is not None and cfg.socket_path.exists())

    def passes(self, ticks: int, checks: int) -> None:
        """Wait for this many more GPU ticks and alert checks, and for what they wrote to be
        committed: how long "nothing more is written" has to be watched, and no longer."""
        jobs = {job.name: job for job in self.daemon.sampler.sched.jobs}
        tick, check = jobs.get("gpu+host") or jobs["gpu"], jobs["alerts"]
        want = (tick.runs + ticks, check.runs + checks)
        wait_for(lambda: tick.runs >= want[0] and check.runs >= want[1], timeout=60)
        assert self.daemon.writer.flush(30)

    def stop(self):
        self.daemon.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def make_nvml() -> fake_pynvml.FakeNvml:
    nvml = fake_pynvml.FakeNvml(gpus=8, procs={IDLE_GPU: [os.getpid()]})  # a real pid: its owner is known
    nvml.set_util(IDLE_GPU, 0)
    nvml.set_lost(LOST_GPU)
    nvml.set_throttle(SICK_GPU, 0x40)  # HW thermal slowdown, for good
    return nvml


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    # Alert checks every 0.25 s instead of 2 s, wish checks every 0.5 s instead of 5 s (the daemon
    # runs in this process): the waits below for "no second alert" take a few ticks, not seconds.
    monkeypatch.setattr(sampler_mod, "CHECK_INTERVAL_S", 0.25)
    monkeypatch.setattr(rules_mod, "WISH_CHECK_MS", 500)
    return Config(
        db=str(tmp_path / "gw.db"),
        system=False,
        interval=0.2,
        host_interval=0.2,
        process_interval=1.0,
        idle_gpu_minutes=0.02,
        throttle_alert_minutes=0.02,
        hung_alert_seconds=0.5,
        stall_floor=1.0,
        stall_factor=5.0,
        disk_low_pct=100.0,
    )


@pytest.mark.slow
def test_every_kind_once_per_incident_and_a_restart_repeats_none(cfg, tmp_path):
    db = cfg.db
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    nvml = make_nvml()
    running = DaemonThread(cfg, nvml)
    try:
        nvml.add_xid(SICK_GPU, 79)
        nvml.set_hung(HUNG_GPU)
        wait_for(lambda: rows(db, "SELECT 1 FROM gpu_samples WHERE gpu_index = ?", SICK_GPU))
        nvml.add_ecc(SICK_GPU, 2)  # after the first reading, its baseline
        staller = subprocess.Popen([PYTHON, "-c", STALLER], env=env, stdout=subprocess.PIPE, text=True)
        subprocess.run(
            [
                *GPUWATCH,
                "run",
                "--no-instrument",
                "--name",
                "failer",
                "--",
                PYTHON,
                "-c",
                "import sys; sys.exit(3)",
            ],
            env=env,
            timeout=120,
        )
        subprocess.run(
            [*GPUWATCH, "run", "--no-instrument", "--name", "fine", "--", "true"], env=env, timeout=120
        )
        subprocess.run([PYTHON, "-c", OOMER], env=env, timeout=120, capture_output=True)
        staller_id = staller.stdout.readline().strip()
        staller.wait(60)
        expected = {
            "run.finished",
            "run.failed",
            "run.oom",
            "run.stalled",
            "run.recovered",
            "gpu.idle_held",
            "gpu.lost",
            "gpu.not_responding",
            "gpu.xid",
            "gpu.ecc",
            "gpu.throttled",
            "disk.low",
        }
        wait_for(lambda: expected <= kinds(db).keys(), timeout=60)
        running.passes(ticks=10, checks=4)  # the conditions still hold for more ticks and checks
        nvml.set_hung(HUNG_GPU, False)
    finally:
        running.stop()
    first = kinds(db)
    assert first == dict.fromkeys(expected, 1) | {"run.finished": 2}, first  # "fine" and the staller

    conn = sqlite3.connect(db)
    by_kind = {a.kind: a for a in stored.recent(conn)}
    conn.close()
    failed = by_kind["run.failed"]
    assert "run failer (" in failed.title and "exit status 3" in failed.title
    assert f"More: gpuwatch show {failed.run_id}" in failed.body and failed.uid == os.getuid()
    oom = by_kind["run.oom"]
    assert "run oomer" in oom.title and "out of HOST memory: requested" in oom.body
    assert f"gpuwatch oom {oom.run_id}" in oom.body
    stalled, recovered = by_kind["run.stalled"], by_kind["run.recovered"]
    assert stalled.run_id == recovered.run_id == staller_id and stalled.incident == recovered.incident
    assert "no step for" in stalled.title and f"gpuwatch stacks {staller_id}" in stalled.body
    if stalled.detail["frames"]:  # py-spy is installed: the main thread's frames, innermost first
        assert "waiting_for_a_batch_that_never_comes" in " ".join(stalled.detail["frames"])
    idle = by_kind["gpu.idle_held"]
    assert idle.pid == os.getpid() and idle.uid == os.getuid() and idle.gpu_index == IDLE_GPU
    assert "held idle" in idle.title and "Command: " in idle.body and idle.detail["used_mem_bytes"] >= 2**30
    assert by_kind["gpu.xid"].detail["xid"] == 79
    assert by_kind["gpu.ecc"].detail == {
        "uuid": by_kind["gpu.ecc"].detail["uuid"],
        "uncorrected": 2,
        "before": 0,
    }
    assert by_kind["gpu.throttled"].detail["family"] == "thermal"
    assert by_kind["gpu.lost"].gpu_index == LOST_GPU and by_kind["gpu.not_responding"].gpu_index == HUNG_GPU
    for a in by_kind.values():
        assert a.host and a.title and "More: gpuwatch " in a.body

    # Restarted with every condition still there (GPU held idle, lost, throttled, disk low):
    # nothing is written again.
    running = DaemonThread(cfg, make_nvml())
    try:
        wait_for(lambda: rows(db, "SELECT count(*) FROM gpu_samples")[0][0] > 0)
        # ten ticks (2 s, longer than every hold time: 1.2 s) and three alert checks
        running.passes(ticks=10, checks=3)
    finally:
        running.stop()
    assert kinds(db) == first


def test_a_gpu_read_late_is_neither_lost_nor_released(cfg):
    """A tick where our busy process read a GPU too late (no sample, the GPU not shown to block)
    says nothing of that GPU: no gpu.lost alert, and its throttle episode goes on, so the alert
    still comes when the throttling has lasted, not from the late tick on."""
    rules = rules_mod.AlertRules(cfg, "node1", clock=lambda: 0)
    statics = [
        GpuStatic(i, f"GPU-{i}", "H100 (simulated)", None, None, None, None, None, None) for i in (0, 1)
    ]
    hot = [GpuSample(i, 0, gpu_util_pct=90, throttle_reasons=0x40) for i in (0, 1)]
    hold_ms = int(cfg.throttle_alert_minutes * 60_000)
    conn = open_rw(cfg.db)
    try:
        for ts, samples in ((0, hot), (hold_ms // 2, hot[1:]), (hold_ms + 1, hot)):
            with conn:
                rules.gpu_job(ts, statics, samples, [], {}, [])(conn)
        alerts = conn.execute("SELECT kind, gpu_index FROM alerts ORDER BY gpu_index").fetchall()
    finally:
        conn.close()
    assert alerts == [("gpu.throttled", 0), ("gpu.throttled", 1)]


def test_idle_held_re_arms_only_after_release(cfg):
    nvml = make_nvml()
    running = DaemonThread(cfg, nvml)
    try:
        wait_for(lambda: kinds(cfg.db).get("gpu.idle_held"))
        nvml.set_util(IDLE_GPU, 50)  # busy: released
        time.sleep(1)
        assert kinds(cfg.db)["gpu.idle_held"] == 1
        nvml.set_util(IDLE_GPU, 0)  # idle again: a new incident once the time has passed again
        wait_for(lambda: kinds(cfg.db).get("gpu.idle_held") == 2)
    finally:
        running.stop()
    incidents = [i for (i,) in rows(cfg.db, "SELECT incident FROM alerts WHERE kind = 'gpu.idle_held'")]
    assert len(set(incidents)) == 2


def test_when_free_wish_fires_once_through_the_daemon_then_is_forgotten(cfg, monkeypatch):
    from gpuwatch.cli.when_free_cmd import when_free

    running = DaemonThread(cfg, make_nvml())
    try:
        wait_for(lambda: rows(cfg.db, "SELECT count(DISTINCT ts_ms) FROM gpu_samples")[0][0] > 3)
        result = CliRunner().invoke(when_free, ["-n", "2", "--mem", "40G", "--window", "0.1"])
        assert result.exit_code == 0, result.output
        assert "stored: one gpus.free alert when 2 GPU(s)" in result.output
        [alert] = wait_for(
            lambda: rows(cfg.db, "SELECT uid, title, detail_json FROM alerts WHERE kind = 'gpus.free'")
        )
        assert rows(cfg.db, "SELECT count(*) FROM alert_wishes") == [(0,)]  # forgotten
        running.passes(ticks=1, checks=6)  # at least two more wish checks
        assert kinds(cfg.db)["gpus.free"] == 1
    finally:
        running.stop()
    uid, title, detail = alert
    assert uid == os.getuid()  # the owner is the peer's uid
    assert "2 GPU(s) free" in title and "CUDA_VISIBLE_DEVICES=" in title
    assert len(json.loads(detail)["gpus"]) == 2 and LOST_GPU not in json.loads(detail)["gpus"]


def test_when_free_refuses_bad_input_in_one_line():
    # through the real command line: `gpuwatch notify when-free`
    result = subprocess.run(
        [*GPUWATCH, "notify", "when-free", "-n", "2", "--mem", "lots"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert result.returncode == 2 and "--mem" in result.stderr, result.stderr


def test_gpuwatch_run_with_no_daemon_writes_its_own_end_as_an_alert(tmp_path):
    db = tmp_path / "embedded.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPUWATCH_DB=str(db))
    result = subprocess.run(
        [
            *GPUWATCH,
            "run",
            "--no-instrument",
            "--name",
            "lonely",
            "--",
            PYTHON,
            "-c",
            "import sys; sys.exit(7)",
        ],
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 7, result.stderr
    [(kind, title, mode)] = rows(
        db, "SELECT a.kind, a.title, r.mode FROM alerts a JOIN runs r USING (run_id)"
    )
    assert (kind, mode) == ("run.failed", "embedded") and "run lonely" in title and "exit status 7" in title


def test_metrics_count_alerts_by_kind(tmp_path):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from gpuwatch.alerts import KINDS
    from gpuwatch.daemon.metrics import start_metrics_server
    from gpuwatch.store import open_rw

    db = tmp_path / "m.db"
    conn = open_rw(db)
    with conn:
        for n, kind in enumerate(["run.failed", "run.failed", "gpu.idle_held", "run.failed"]):
            stored.record(
                conn, stored.Alert(kind=kind, incident=f"i{n}", ts_ms=n, host="h", title="t", body="b")
            )
        stored.record(
            conn, stored.Alert(kind="run.failed", incident="i0", ts_ms=9, host="h", title="t", body="b")
        )
    conn.close()
    server = start_metrics_server("127.0.0.1:0", db, hostname="node7")
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.close()
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "gpuwatch_alerts"]
    assert family.type == "counter"
    counts = {s.labels["kind"]: s.value for s in family.samples if s.name == "gpuwatch_alerts_total"}
    assert counts == {**dict.fromkeys(KINDS, 0.0), "run.failed": 3.0, "gpu.idle_held": 1.0}
    assert {s.labels["Hostname"] for s in family.samples} == {"node7"}


def test_browse_describes_the_alert_tables_and_they_hold_no_url(tmp_path):
    from gpuwatch.browse.metadata import QUERIES, metadata
    from gpuwatch.store import open_rw

    conn = open_rw(tmp_path / "b.db")
    columns = {
        t: [c[1] for c in conn.execute(f"PRAGMA table_info({t})")]
        for t in ("alerts", "alert_episodes", "alert_wishes")
    }
    for sql in (QUERIES["alerts_per_day"]["sql"],):
        conn.execute(sql).fetchall()  # the canned query runs on the schema
    conn.close()
    tables = metadata("gw", columns)["databases"]["gw"]["tables"]
    assert "one row per alert incident" in tables["alerts"]["description"].lower()
    assert tables["alerts"]["columns"]["ts_ms"].startswith("when the event happened")
    assert not [c for cs in columns.values() for c in cs if "url" in c or "secret" in c or "token" in c]


LOSER = """
import time, gpuwatch
with gpuwatch.track(name="loser") as run:
    run.step(tokens=8)
    print(run.run_id, flush=True)
    time.sleep(120)
"""


def test_a_run_whose_process_dies_unannounced_is_lost_once(cfg):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    running = DaemonThread(cfg, make_nvml())
    try:
        child = subprocess.Popen([PYTHON, "-c", LOSER], env=env, stdout=subprocess.PIPE, text=True)
        run_id = child.stdout.readline().strip()
        wait_for(lambda: rows(cfg.db, "SELECT 1 FROM runs WHERE run_id = ? AND last_step_ms", run_id))
        child.kill()  # no run_end ever comes
        child.wait()
        [(title, body)] = wait_for(
            lambda: rows(cfg.db, "SELECT title, body FROM alerts WHERE kind = 'run.lost'")
        )
    finally:
        running.stop()
    assert f"run loser ({run_id}) was lost" in title and f"More: gpuwatch show {run_id}" in body
    assert "was lost: its process is gone" in body


def test_run_slow_once_per_slow_spell_against_the_runs_own_median(tmp_path):
    import socket

    from gpuwatch.alerts.episodes import Episodes
    from gpuwatch.alerts.run_rules import slow_alerts
    from gpuwatch.store import insert_rows, open_rw

    cfg = Config(db=str(tmp_path / "s.db"), slow_alert_pct=50.0, slow_alert_minutes=1.0)
    host, now = socket.gethostname(), 10_000_000
    conn = open_rw(cfg.db)
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id="r",
                name="slowpoke",
                uid=1000,
                user="alice",
                host=host,
                started_ms=now - 600_000,
                last_step_ms=now - 1000,
            )
        ],
    )
    # 1000 tokens/s for 8 minutes, then 300 for the last minute and a half
    insert_rows(
        conn,
        "steps",
        [
            dict(
                run_id="r", step=i, ts_ms=now - 540_000 + 1000 * i, tokens_per_s=1000.0 if i < 450 else 300.0
            )
            for i in range(540)
        ],
    )
    episodes = Episodes()
    [alert] = slow_alerts(conn, cfg, host, now, episodes)
    assert alert.kind == "run.slow" and alert.run_id == "r"
    assert "300 tokens/s, 30 % of its median" in alert.title and "1,000 tokens/s" in alert.body
    assert slow_alerts(conn, cfg, host, now + 10_000, episodes) == []  # the same spell
    assert slow_alerts(conn, cfg, host, now + 10_000, Episodes()) == []  # after a restart too
    # it speeds up (released), then slows again: a second spell, a second alert
    insert_rows(conn, "steps", [dict(run_id="r", step=600, ts_ms=now + 20_000, tokens_per_s=1000.0)])
    assert slow_alerts(conn, cfg, host, now + 20_000, episodes) == []
    insert_rows(
        conn,
        "steps",
        [
            dict(run_id="r", step=700 + i, ts_ms=now + 100_000 + 1000 * i, tokens_per_s=200.0)
            for i in range(70)
        ],
    )
    conn.execute("UPDATE runs SET last_step_ms = ?", (now + 169_000,))
    [again] = slow_alerts(conn, cfg, host, now + 170_000, episodes)
    assert again.incident != alert.incident
    conn.close()


def test_gpuwatch_run_with_no_daemon_alerts_its_own_stall_and_recovery(tmp_path):
    db = tmp_path / "embedded.db"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        GPUWATCH_DB=str(db),
        GPUWATCH_STALL_FLOOR="1",
        GPUWATCH_STALL_FACTOR="5",
    )
    result = subprocess.run(
        [*GPUWATCH, "run", "--name", "emb", "--", PYTHON, "-c", STALLER],
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    found = rows(db, "SELECT a.kind, r.name, r.mode FROM alerts a JOIN runs r USING (run_id) ORDER BY a.id")
    assert found == [
        ("run.stalled", "emb", "embedded"),
        ("run.recovered", "emb", "embedded"),
        ("run.finished", "emb", "embedded"),
    ], found


@pytest.mark.parametrize(
    "change, complaint",
    [
        ({"gpus": 0}, "wish.gpus: expected integer from 1 to 4096"),
        ({"min_free_bytes": "40G"}, "wish.min_free_bytes: expected integer >= 0"),
        ({"max_util_pct": 120}, "wish.max_util_pct: expected number from 0 to 100"),
        ({"window_min": float("nan")}, "wish.window_min: expected minutes from 0.1 to 1440"),
    ],
)
def test_a_bad_wish_frame_gets_one_line_naming_the_field(change, complaint):
    from gpuwatch import protocol

    frame = {
        "v": protocol.VERSION,
        "type": "wish",
        "gpus": 2,
        "min_free_bytes": 2**30,
        "max_util_pct": 10.0,
        "window_min": 5.0,
    }
    assert protocol.validate(frame).type == "wish"
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.validate({**frame, **change})
    assert str(caught.value).startswith(complaint) and "\n" not in str(caught.value)


def test_when_free_with_no_daemon_keeps_the_wish_in_my_database_for_an_embedded_sampler(
    tmp_path, monkeypatch
):
    from gpuwatch.cli.when_free_cmd import when_free
    from gpuwatch.monitor.sampler import Sampler
    from gpuwatch.store import Writer, open_ro
    from gpuwatch.store.alert_wishes import wishes

    db = tmp_path / "mine.db"
    monkeypatch.setenv("GPUWATCH_DB", str(db))
    result = CliRunner().invoke(when_free, ["-n", "1", "--mem", "10G", "--window", "0.1"])
    assert result.exit_code == 0, result.output
    assert "(no daemon answers)" in result.output and "--on gpus.free" in result.output
    conn = open_ro(db)
    [wish] = wishes(conn, __import__("socket").gethostname())
    conn.close()
    assert (wish.uid, wish.gpus, wish.min_free_bytes) == (os.getuid(), 1, 10 * 2**30)

    writer = Writer(db)
    sampler = Sampler(
        writer, Config(db=str(db), interval=0.2, host_interval=0.2), nvml_module=fake_pynvml.FakeNvml(gpus=2)
    )
    sampler.start()
    try:
        [(uid, title)] = wait_for(lambda: rows(db, "SELECT uid, title FROM alerts WHERE kind = 'gpus.free'"))
    finally:
        sampler.stop()
        writer.close()
    assert uid == os.getuid() and "1 GPU(s) free" in title
    assert rows(db, "SELECT count(*) FROM alert_wishes") == [(0,)]


def test_run_slow_names_the_top_cause_that_gpuwatch_why_finds(tmp_path):
    """A run slowed by another user's CPU hog: its run.slow alert says what `gpuwatch why` ranks
    first, with the hog's pid and command."""
    import socket

    from why_scenarios import T0, Scenario

    from gpuwatch.alerts.episodes import Episodes
    from gpuwatch.alerts.run_rules import slow_alerts
    from gpuwatch.store import open_rw

    sc = Scenario(seconds=180)  # slowed over its last minute, [120 s, 180 s)
    sc.cpu_hog()
    sc.runs[0].update(status="running", ended_ms=None, host=socket.gethostname(), last_step_ms=T0 + 179_500)
    path = sc.write(tmp_path / "why.db")
    cfg = Config(db=str(path), slow_alert_pct=80.0, slow_alert_minutes=0.8)  # inside the slow minute
    conn = open_rw(path)
    [alert] = slow_alerts(conn, cfg, socket.gethostname(), T0 + 180_000, Episodes())
    assert "Likely cause: host_cpu" in alert.body and "python preprocess.py" in alert.body, alert.body
    assert alert.detail["cause"].startswith("host_cpu")

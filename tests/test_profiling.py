"""Profiler windows: scheduled (embedded), on demand end to end through a real daemon, refusals."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatch.cli import main
from gpuwatch.store import open_ro, profiles

ROOT = Path(__file__).parents[1]

TRAINER = """
import sys, time, torch, gpuwatch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
with gpuwatch.track(name="prof", run_id=sys.argv[1] if len(sys.argv) > 1 else None) as run:
    print(run.run_id, flush=True)
    for _ in range(int({steps})):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        model.zero_grad(); loss.backward()
        with torch.no_grad():  # updated by hand: torch.optim's first use imports dynamo (~1 CPU-s a program)
            for p in model.parameters():
                p -= 0.01 * p.grad
        run.step(tokens=16, loss=loss.detach())
        time.sleep({sleep})
"""

DAEMON = """
import sys
from gpuwatch.base.config import Config
from gpuwatch.daemon.main import run_daemon
sys.exit(run_daemon(Config(db=sys.argv[1], socket=sys.argv[2], system=True, interval=5.0,
                           host_interval=5.0, process_interval=30.0)))
"""


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)


def _db_rows(db: Path, sql: str, *params):
    conn = open_ro(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_scheduled_windows_store_top_ops_and_a_gzipped_chrome_trace(tmp_path):
    db, runs = tmp_path / "gw.db", tmp_path / "runs"
    env = _env(
        GPUWATCH_DB=str(db),
        GPUWATCH_RUNS_DIR=str(runs),
        GPUWATCH_PROFILE_WAIT="1",
        GPUWATCH_PROFILE_WARMUP="1",
        GPUWATCH_PROFILE_ACTIVE="2",
        GPUWATCH_PROFILE_REPEAT="2",
    )
    # A hostile run id must not put files outside the runs directory.
    out = subprocess.run(
        [sys.executable, "-c", TRAINER.format(steps=10, sleep=0), "../../escape"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = _db_rows(
        db,
        "SELECT id, trigger, first_step, steps, trace_path, trace_bytes FROM profiles "
        "WHERE run_id = '../../escape' ORDER BY first_step",
    )
    # wait 1 + warmup 1 + active 2 per cycle: steps 3-4 and 7-8.
    assert [(r[1], r[2], r[3]) for r in rows] == [("scheduled", 3, 2), ("scheduled", 7, 2)]
    for _, _, _, _, path, size in rows:
        trace = Path(path)
        assert trace.resolve().is_relative_to(runs.resolve()) and trace.name.endswith(".json.gz")
        assert trace.stat().st_size == size
        events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
        assert any(e.get("name") == "aten::addmm" for e in events)
    conn = open_ro(db)
    try:
        ops = profiles.profile_ops(conn, rows[0][0])
    finally:
        conn.close()
    addmm = next(op for op in ops if op.name == "aten::addmm")
    assert addmm.calls == 2 * 2  # two Linear layers in each of the two profiled steps
    assert addmm.self_cpu_us > 0 and addmm.cpu_total_us >= addmm.self_cpu_us
    assert addmm.self_device_us is None  # a CPU-only window measured no device time, not 0
    # each window's trace analysed and stored with it: CPU-only, so the CPU-side split
    for profile_id, *_ in rows:
        [(gpu, ops_pct, idle_pct)] = _db_rows(
            db,
            "SELECT gpu, cpu_operators_pct, idle_pct FROM profile_breakdowns WHERE profile_id = ?",
            profile_id,
        )
        assert gpu == 0 and 0 < ops_pct <= 100 and idle_pct is None
    assert not list(tmp_path.glob("escape*")) and not (tmp_path.parent / "escape").exists()


def test_each_window_is_analysed_in_a_low_priority_process_beside_the_training(tmp_path):
    """The trace's breakdown is worked out by another process (not the training one, at nice
    +10 over it) and stored with the window exactly as the analysis gives it."""
    from gpuwatch.client.trace_worker import breakdown_of

    db, runs = tmp_path / "gw.db", tmp_path / "runs"
    env = _env(GPUWATCH_DB=str(db), GPUWATCH_RUNS_DIR=str(runs), GPUWATCH_PROFILE_ACTIVE="2")
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER.format(steps=3, sleep=0)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = trainer.communicate(timeout=120)
    assert trainer.returncode == 0, err
    [(path, stored)] = _db_rows(
        db,
        "SELECT p.trace_path, b.breakdown_json FROM profiles p "
        "JOIN profile_breakdowns b ON b.profile_id = p.id",
    )
    stored = json.loads(stored)
    analysed_by = stored.pop("analysed_by")
    assert analysed_by["pid"] not in (trainer.pid, os.getpid())
    assert analysed_by["nice"] >= min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
    assert stored == json.loads(json.dumps(breakdown_of(Path(path))))


def test_a_trace_over_the_size_cap_is_dropped_and_the_ops_kept(tmp_path):
    db, runs = tmp_path / "gw.db", tmp_path / "runs"
    env = _env(
        GPUWATCH_DB=str(db),
        GPUWATCH_RUNS_DIR=str(runs),
        GPUWATCH_PROFILE_ACTIVE="2",
        GPUWATCH_PROFILE_MAX_MB="0.0001",
    )
    out = subprocess.run(
        [sys.executable, "-c", TRAINER.format(steps=3, sleep=0)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "trace dropped" in out.stderr and "top operators kept" in out.stderr
    [(pid_, path, size)] = _db_rows(db, "SELECT id, trace_path, trace_bytes FROM profiles")
    assert path is None and size > 0.0001 * 2**20
    assert _db_rows(db, "SELECT count(*) FROM profile_ops WHERE profile_id = ?", pid_)[0][0] > 5
    assert not _db_rows(db, "SELECT 1 FROM profile_breakdowns")  # no trace kept, nothing to read
    assert not [p for p in runs.rglob("*") if p.is_file()]


@pytest.fixture
def daemon(tmp_path):
    """A real daemon subprocess (system mode: other users may connect) on a short temp socket."""
    base = Path(tempfile.mkdtemp(prefix="gwp-", dir="/tmp"))
    base.chmod(0o755)
    db, sock = base / "gw.db", base / "gw.sock"
    proc = subprocess.Popen(
        [sys.executable, "-c", DAEMON, str(db), str(sock)],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "the daemon did not listen in time"
        time.sleep(0.05)
    yield db, sock
    proc.terminate()
    proc.wait(10)
    subprocess.run(["rm", "-rf", str(base)], check=False)


REFUSED = """
import json, os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb")
def ask(frame):
    f.write(json.dumps(dict(frame, v=1)).encode() + b"\\n"); f.flush()
    return json.loads(f.readline())
ask({"type": "hello"})
print(json.dumps(ask({"type": "control_request", "run_id": sys.argv[2], "action": "profile", "steps": 2})))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the refusal test switches to uid 65534")
def test_on_demand_profile_through_the_daemon_end_to_end(daemon, monkeypatch, tmp_path):
    db, sock = daemon
    runs = tmp_path / "runs"  # the client writes its traces: the run owner's files
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER.format(steps=2000, sleep=0.02)],
        env=_env(GPUWATCH_SOCKET=str(sock), GPUWATCH_RUNS_DIR=str(runs)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = trainer.stdout.readline().strip()
        deadline = time.monotonic() + 30
        while not _db_rows(db, "SELECT 1 FROM steps WHERE run_id = ?", run_id):
            assert time.monotonic() < deadline, "no steps reached the daemon"
            time.sleep(0.1)

        refused = subprocess.run(
            [sys.executable, "-c", REFUSED, str(sock), run_id], capture_output=True, text=True, timeout=30
        )
        reply = json.loads(refused.stdout)
        assert reply["code"] == "forbidden" and "uid 65534 may not control" in reply["error"]

        monkeypatch.setenv("GPUWATCH_SOCKET", str(sock))
        result = CliRunner().invoke(
            main, ["profile", run_id, "--steps", "3", "--db", str(db), "--wait", "60"]
        )
        assert result.exit_code == 0, result.output
        assert "on_demand" in result.output and "aten::addmm" in result.output
        # the window's breakdown came with it: the CPU-side bar and advice before the operators
        out = result.output
        assert out.index("CPU time") < out.index("advice:") < out.index("OPERATOR")
    finally:
        trainer.kill()
        trainer.wait()
    [(trigger, steps, path)] = _db_rows(
        db, "SELECT trigger, steps, trace_path FROM profiles WHERE run_id = ?", run_id
    )
    assert (trigger, steps) == ("on_demand", 3)
    assert Path(path).is_relative_to(runs)
    assert json.loads(gzip.decompress(Path(path).read_bytes()))["traceEvents"]


def test_on_demand_profiling_without_a_daemon_says_it_needs_one(tmp_path, monkeypatch):
    db = tmp_path / "gw.db"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER.format(steps=400, sleep=0.05)],
        env=_env(GPUWATCH_DB=str(db)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = trainer.stdout.readline().strip()
        time.sleep(0.5)
        monkeypatch.setenv("GPUWATCH_SOCKET", str(tmp_path / "nobody.sock"))
        result = CliRunner().invoke(main, ["profile", run_id, "--db", str(db)])
    finally:
        trainer.kill()
        trainer.wait()
    assert result.exit_code == 1
    assert "on-demand profiling needs the gpuwatch daemon" in result.output


def _store_with_a_profile(db: Path) -> str:
    """A real store: a run with one profile (3 ops), a stall stack dump and a capacity study."""
    from gpuwatch.store import insert_rows, open_rw
    from gpuwatch.store.events import Peer, apply_events

    conn = open_rw(db)
    peer = Peer(os.getuid(), "me", os.getpid(), "embedded")
    ops = [
        {
            "name": "aten::mm",
            "calls": 4,
            "self_cpu_us": 900.0,
            "cpu_total_us": 950.0,
            "self_device_us": 5000.0,
            "device_total_us": 5000.0,
            "self_mem_bytes": 1 << 20,
        },
        {
            "name": "aten::softmax",
            "calls": 2,
            "self_cpu_us": 3000.0,
            "cpu_total_us": 3100.0,
            "self_device_us": 800.0,
            "device_total_us": 800.0,
            "self_mem_bytes": 0,
        },
        {
            "name": "aten::add_",
            "calls": 9,
            "self_cpu_us": 10.0,
            "cpu_total_us": 10.0,
            "self_device_us": 20.0,
            "device_total_us": 20.0,
            "self_mem_bytes": 0,
        },
    ]
    with conn:
        outcome = apply_events(
            conn,
            [
                {"id": "1", "kind": "run_start", "run_id": "r1", "ts_ms": 1000, "name": "tui-run"},
                {
                    "id": "2",
                    "kind": "profile",
                    "run_id": "r1",
                    "ts_ms": 2000,
                    "trigger": "on_demand",
                    "first_step": 11,
                    "steps": 3,
                    "trace_bytes": 999_999_999,
                    "ops": ops,
                },
                {
                    "id": "3",
                    "kind": "profile",
                    "run_id": "r1",
                    "ts_ms": 2000,
                    "trigger": "on_demand",
                    "first_step": 11,
                    "steps": 3,
                    "ops": ops,
                },  # replayed: changes nothing
            ],
            peer,
        )
        assert not outcome.rejected
        threads = [
            {
                "thread_name": "MainThread",
                "active": False,
                "frames": [{"name": "waiting_for_a_batch", "short_filename": "train.py", "line": 7}],
            }
        ]
        insert_rows(
            conn,
            "stack_dumps",
            [
                {
                    "run_id": "r1",
                    "pid": 42,
                    "ts_ms": 3000,
                    "reason": "stall",
                    "stacks_json": json.dumps(threads),
                }
            ],
        )
        conn.execute(
            "INSERT INTO capacity_studies (id, ts_ms, command, device, limit_bytes, margin, fit_json, "
            "predicted_json) VALUES (1, 4000, 'python -m workloads.gpt_train', 'cpu', 1073741824, 0.1, "
            '\'{"4": {"a": 1e8, "b": 1e4, "c": 100}}\', '
            '\'{"4": {"max_seq_len": 2000, "predicted_peak_bytes": 520000000, '
            '"verified_peak_bytes": 510000000}}\')'
        )
        insert_rows(
            conn,
            "capacity_points",
            [
                {
                    "study_id": 1,
                    "batch": 4,
                    "seq_len": 512,
                    "peak_bytes": 131_000_000,
                    "ok": 1,
                    "kind": "measured",
                },
                {"study_id": 1, "batch": 4, "seq_len": 4096, "peak_bytes": None, "ok": 0, "kind": "measured"},
            ],
        )
    conn.close()
    return "r1"


def test_tui_profile_screen_sorts_top_ops_and_the_run_view_shows_stacks(tmp_path, monkeypatch):
    import asyncio
    import io

    from rich.console import Console

    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.screens.capacity import study_panel
    from gpuwatch.tui.screens.run import RunScreen
    from gpuwatch.tui.source import StoreSource

    db = tmp_path / "gw.db"
    run_id = _store_with_a_profile(db)
    monkeypatch.setenv("GPUWATCH_SOCKET", str(tmp_path / "nobody.sock"))
    assert _db_rows(db, "SELECT count(*) FROM profiles")[0][0] == 1

    async def drive():
        app = GpuwatchApp(StoreSource(str(db)), refresh_s=0.05)
        async with app.run_test(size=(80, 24)) as pilot:
            app.push_screen(RunScreen(run_id))
            await pilot.pause(0.3)
            stacks = str(app.screen.query_one("#run-stacks").render())
            assert "stacks (stall, pid 42" in stacks and "waiting_for_a_batch (train.py:7)" in stacks
            assert "profiles: 1" in stacks
            await pilot.press("P")  # no daemon here: the answer says what is missing
            deadline = time.monotonic() + 30
            while not any("needs the gpuwatch daemon" in str(n.message) for n in app._notifications):
                assert time.monotonic() < deadline, [n.message for n in app._notifications]
                await pilot.pause(0.2)
            await pilot.press("p")
            await pilot.pause(0.3)
            assert type(app.screen).__name__ == "ProfileScreen"
            table = app.screen.query_one("#profile-ops")
            names = lambda: [str(table.get_row_at(i)[0]) for i in range(table.row_count)]  # noqa: E731
            assert names() == ["aten::mm", "aten::softmax", "aten::add_"]  # by self device time
            head = str(app.screen.query_one("#profile-head").render())
            assert "steps 11-13" in head and "trace dropped" in head
            await pilot.press("s")
            assert names() == ["aten::softmax", "aten::mm", "aten::add_"]  # by self CPU time
            await pilot.press("escape", "C")
            await pilot.pause(0.3)
            assert type(app.screen).__name__ == "CapacityScreen"
            console = Console(width=80, record=True, file=io.StringIO())
            console.print(study_panel(app.screen.shown.capacity))
            panel = console.export_text()
            assert "batch 4: max seq_len 2000 (predicted 495.9 MiB, measured 486.4 MiB)" in panel
            assert "4096        OOM    1.7 GiB  measured" in panel  # no measurement, the fit still shown

    asyncio.run(drive())


def test_a_stored_breakdown_leads_profile_show_and_reaches_show_compare_report(tmp_path):
    """A profile event with its trace breakdown: `profile --show` prints the bar and advice
    before the operators; `show`, `compare` and `report` carry the headline figures."""
    from trace_gen import make_trace, write_trace

    from gpuwatch.client.trace_worker import breakdown_of
    from gpuwatch.store import open_rw
    from gpuwatch.store.events import Peer, apply_events

    trace = write_trace(tmp_path / "t.json.gz", make_trace(loader_us=6000.0))
    breakdown = breakdown_of(trace)
    db = tmp_path / "gw.db"
    conn = open_rw(db)
    peer = Peer(os.getuid(), "me", os.getpid(), "embedded")
    with conn:
        outcome = apply_events(
            conn,
            [
                {"id": "1", "kind": "run_start", "run_id": "r1", "ts_ms": 1000, "name": "slow-loader"},
                {
                    "id": "2",
                    "kind": "profile",
                    "run_id": "r1",
                    "ts_ms": 2000,
                    "trigger": "on_demand",
                    "first_step": 1,
                    "steps": 4,
                    "trace_path": str(trace),
                    "trace_bytes": 1,
                    "ops": [{"name": "aten::mm", "calls": 3, "self_cpu_us": 10.0}],
                    "breakdown": breakdown,
                },
                {"id": "3", "kind": "run_start", "run_id": "r2", "ts_ms": 1000, "name": "plain"},
                {
                    "id": "4",
                    "kind": "profile",
                    "run_id": "r2",
                    "ts_ms": 2000,
                    "trigger": "scheduled",
                    "breakdown": {"gpu": True, "temporal": {"idle_pct": "lots"}},
                },  # refused, one line
            ],
            peer,
        )
    conn.close()
    assert [(i, msg) for i, _, msg in outcome.rejected] == [
        ("4", "breakdown idle_pct: expected a finite number")
    ]
    idle = breakdown["temporal"]["idle_pct"]
    assert idle > 10 and breakdown["idle"]["dataloader_pct"] > 50

    out = CliRunner().invoke(main, ["profile", "r1", "--show", "--db", str(db)]).output
    lines = out.splitlines()
    bar = next(i for i, line in enumerate(lines) if line.startswith("[█"))
    assert bar < next(i for i, line in enumerate(lines) if line.startswith("OPERATOR"))
    assert "waiting for the data loader" in out and "advice:" in out
    assert all(len(line) <= 80 for line in lines[2:])

    show = CliRunner().invoke(main, ["show", "r1", "--db", str(db)]).output
    assert f"profile   GPU idle {idle:.0f}%" in show and "data loader" in show
    compare = CliRunner().invoke(main, ["compare", "r1", "r2", "--db", str(db)]).output
    assert "GPU idle (profile)" in compare and f"{idle:.1f} %" in compare
    from gpuwatch.tui.source import profile_row

    conn = open_ro(db)
    try:  # what the TUI's Profile screen is handed
        assert json.loads(profile_row(conn, "r1").breakdown_json)["temporal"]["idle_pct"] == idle
        assert profile_row(conn, "r2") is None  # its refused profile left nothing half-stored
    finally:
        conn.close()
    report = CliRunner().invoke(main, ["report", "r1", "--db", str(db), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.output
    assert f"{idle:.1f} %" in (tmp_path / "r.html").read_text()

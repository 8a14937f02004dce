"""Data wait: the share of each step spent before its compute began (waiting for the batch),
from run.mark_compute() and the zero-code hooks; stored per step, shown by `show` and the Run
screen. The loops sleep in their "data loader" for a known share of each step."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

import gpuwatch
from gpuwatch import protocol
from gpuwatch.base import paths

DATA_S, COMPUTE_S = 0.06, 0.04  # 60 % of each step waits for data
# Wide: sleeps overshoot on a shared 2-core box, and step time includes our own bookkeeping.
LOW, HIGH = 40.0, 80.0


def steps_table() -> list[sqlite3.Row]:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM steps ORDER BY step").fetchall()
    finally:
        conn.close()


def test_a_loop_that_waits_for_its_data_gets_that_share_of_each_step():
    with gpuwatch.track(name="slow-loader") as run:
        for _ in range(5):
            time.sleep(DATA_S)  # the data loader
            run.mark_compute()
            time.sleep(COMPUTE_S)  # forward, backward, optimiser
            run.mark_compute()  # a second micro-batch: only the first call counts
            run.step(tokens=64)
    steps = steps_table()
    assert steps[0]["data_wait_pct"] is None  # the first step's time includes the set-up
    for s in steps[1:]:
        assert LOW < s["data_wait_pct"] < HIGH, dict(s)


def test_steps_without_a_marked_compute_start_have_no_data_wait():
    with gpuwatch.track() as run:
        for _ in range(3):
            run.step(tokens=8)
    assert [s["data_wait_pct"] for s in steps_table()] == [None, None, None]


def test_a_data_wait_outside_0_to_100_percent_is_refused_in_one_line():
    event = {"id": "e1", "kind": "step", "run_id": "r1", "ts_ms": 1, "step": 1, "data_wait_pct": 140.0}
    with pytest.raises(protocol.ProtocolError) as refused:
        protocol.validate_event(event)
    assert "data_wait_pct" in str(refused.value) and "0 to 100" in str(refused.value)
    protocol.validate_event(dict(event, data_wait_pct=37.5))


SLOW_LOADER_SCRIPT = f"""
import time, torch
model = torch.nn.Linear(8, 8)
def batches():  # a slow data loader
    while True:
        time.sleep({DATA_S})
        yield torch.randn(4, 8)
for _, x in zip(range(6), batches()):
    model.zero_grad()
    loss = model(x).square().mean()
    time.sleep({COMPUTE_S})  # the rest of a step's compute
    loss.backward()
    with torch.no_grad():  # updated by hand: torch.optim's first use imports dynamo (~1 CPU-s)
        for p in model.parameters():
            p -= 0.01 * p.grad
print("done")
"""


@pytest.mark.slow
def test_an_unmodified_script_under_gpuwatch_run_gets_its_data_wait(tmp_path):
    pytest.importorskip("torch")
    script = tmp_path / "slow_loader.py"
    script.write_text(SLOW_LOADER_SCRIPT)
    gw = str(Path(sys.executable).with_name("gpuwatch"))
    done = subprocess.run(
        [gw, "run", "--", sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    steps = steps_table()
    assert len(steps) == 6
    # From the second step: the model's forward pre-hook marks where compute begins.
    for s in steps[1:]:
        assert LOW < s["data_wait_pct"] < HIGH, dict(s)


def _run_with_data_wait() -> str:
    with gpuwatch.track(name="slow-loader") as run:
        for _ in range(4):
            time.sleep(0.02)
            run.mark_compute()
            time.sleep(0.02)
            run.step(tokens=64)
    return run.run_id


def test_show_prints_the_data_wait_of_the_steps():
    from gpuwatch.cli import main

    run_id = _run_with_data_wait()
    out = CliRunner().invoke(main, ["show", run_id, "--db", str(paths.default_db_path(system=False))])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.strip().startswith("data wait"))
    assert "% of each step" in line


@pilot_test
async def test_the_run_screen_charts_the_data_wait_of_each_step():
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.screens.run import RunScreen
    from gpuwatch.tui.source import StoreSource

    run_id = _run_with_data_wait()
    app = GpuwatchApp(StoreSource(str(paths.default_db_path(system=False))), refresh_s=0.05)
    async with app.run_test(size=(80, 60)) as pilot:
        await app.push_screen(RunScreen(run_id))
        await pilot.pause(0.3)
        charts = [c.chart for c in app.screen.query("ChartView")]
        wait = next(c for c in charts if c.title.startswith("data wait"))
        values = [v for _, v in wait.series[0].points]
        assert len(values) == 3 and all(20 < v < 80 for v in values)
        shown = "\n".join(str(c.render()) for c in app.screen.query("ChartView"))
        assert "data wait (share of each step)" in shown and "waiting for data" in shown


@pytest.mark.gpu
def test_on_a_gpu_the_data_wait_is_the_gap_the_gpu_waited():
    """Tiny kernels: the GPU reaches each CUDA event about when the host records it, so the
    gap before the compute event is the loader's sleep (60 % of the step, as on the CPU)."""
    torch = pytest.importorskip("torch")
    a = torch.randn(64, 64, device="cuda")
    with gpuwatch.track(name="slow-loader-gpu") as run:
        for _ in range(6):
            time.sleep(DATA_S)
            run.mark_compute()
            b = a @ a
            time.sleep(COMPUTE_S)
            run.step(tokens=64, loss=b.sum())
    for s in steps_table()[1:]:
        assert LOW < s["data_wait_pct"] < HIGH, dict(s)

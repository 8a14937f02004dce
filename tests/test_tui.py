"""The TUI against fixed data: navigation, sorting, filtering, signals, and screen snapshots.

A fixed source stands in for the store (STYLE: the app takes its source in the constructor);
its clock is fixed too, so what is drawn never depends on when the test runs.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.snapshot import (
    Chart,
    GpuRow,
    HostRow,
    ProcessRow,
    ProfileRow,
    RunDetail,
    RunRow,
    Series,
    Snapshot,
    View,
)

NOW = 1_764_676_800_000  # 2025-12-02 12:00:00 UTC
GiB = 2**30
ME = os.getuid()
OTHER = ME + 4242


def _gpus() -> tuple[GpuRow, ...]:
    rows = []
    for i in range(4):
        rows.append(
            GpuRow(
                index=i,
                name="NVIDIA H100 80GB HBM3",
                util_pct=[97, 12, 0, 55][i],
                util_history=tuple(50 + 45 * math.sin((t + i * 7) / 6) for t in range(60)),
                mem_used_bytes=[70, 8, 0, 40][i] * GiB,
                mem_total_bytes=80 * GiB,
                temp_c=[78, 45, 31, 60][i],
                power_mw=[690_000, 120_000, 70_000, 400_000][i],
                power_limit_mw=700_000,
                throttle_reasons=[0x4 | 0x40, 0, 0x1, 0][i],
                ecc_uncorrected=[0, 0, 0, 2][i],
                # GPM on GPUs 0 and 3 only: the others show "n/a"
                sm_active_pct=[81.0, None, None, 44.5][i],
                tensor_active_pct=[62.0, None, None, 0.0][i],
                dram_active_pct=[35.0, None, None, 12.0][i],
                sm_occupancy_pct=[40.0, None, None, 20.0][i],
            )
        )
    rows.append(GpuRow(index=4, name="NVIDIA H100 80GB HBM3", state="lost"))
    return tuple(rows)


def _processes(child_pid: int | None = None) -> tuple[ProcessRow, ...]:
    procs = [
        ProcessRow(
            0, 3101, OTHER, "alice", 60 * GiB, 95, 101.0, "llama-long-ctx", "python train.py --seq 131072"
        ),
        ProcessRow(1, 3202, OTHER, "bob", 8 * GiB, 10, 12.0, None, "python eval.py"),
        ProcessRow(3, 3303, ME, "me", 40 * GiB, 50, 99.0, "my-sweep", "torchrun --nproc 1 sweep.py"),
    ]
    if child_pid:
        procs.append(ProcessRow(2, child_pid, ME, "me", 1 * GiB, 1, 0.0, None, "sleep 60"))
    return tuple(procs)


RUNS = (
    RunRow(
        "r-llama",
        "llama-long-ctx",
        "alice",
        "running",
        NOW - 3 * 3600_000,
        None,
        41_200,
        40_100,
        71 * GiB,
        False,
        0,
        2,
    ),
    RunRow("r-sweep", "my-sweep", "me", "running", NOW - 600_000, None, 9_800, 9_500, 39 * GiB),
    RunRow(
        "r-oom", "seq-262k", "alice", "oom", NOW - 86_400_000, NOW - 86_000_000, None, 30_000, 79 * GiB, True
    ),
    RunRow(
        "r-done",
        "baseline",
        "bob",
        "finished",
        NOW - 2 * 86_400_000,
        NOW - 86_400_000 - 5_000,
        None,
        12_000,
        20 * GiB,
    ),
)


def _detail(run_id: str, range_s: int | None) -> RunDetail | None:
    run = next((r for r in RUNS if r.run_id == run_id), None)
    if run is None:
        return None
    end = run.ended_ms or NOW
    since = run.started_ms if range_s is None else max(run.started_ms, end - range_s * 1000)
    ts = [since + (end - since) * k // 120 for k in range(121)]
    tps = tuple((t, 40_000 + 2_000 * math.sin(k / 9)) for k, t in enumerate(ts))
    step = tuple((t, 410 + 20 * math.cos(k / 9)) for k, t in enumerate(ts))
    alloc = tuple((t, (30 + 10 * (k % 30) / 30) * GiB) for k, t in enumerate(ts))
    reserved = tuple((t, 45 * GiB) for t in ts)
    util = tuple((t, 90 + 8 * math.sin(k / 4)) for k, t in enumerate(ts))
    loss = tuple((t, 2.1 + 6 * math.exp(-k / 25) + 0.05 * math.sin(k)) for k, t in enumerate(ts))
    return RunDetail(
        run=run,
        host="gpu-node-07",
        pid=3101,
        command="python train.py --seq 131072",
        job_id="job-17",
        end_state="" if run.status == "running" else f"{run.status}",
        ranks=(run, replace(run, run_id="r-llama-1", rank=1)),
        config=(("lr", "0.0003"), ("seq_len", "131072"), ("batch", "1")),
        charts=(
            Chart("tokens/s", (Series("tokens/s", "per_s", tps),)),
            Chart("loss", (Series("loss", "loss", loss),)),
            Chart("step time", (Series("step", "ms", step),)),
            Chart(
                "allocator memory",
                (Series("allocated", "bytes", alloc), Series("reserved", "bytes", reserved)),
            ),
            Chart("GPU 0", (Series("util", "pct", util),)),
        ),
        since_ms=since,
        energy_j=412_000.0,
        joules_per_token=0.31,
    )


_PROFILE: list[ProfileRow] = []


def _profile(run_id: str) -> ProfileRow:
    """A profile whose breakdown is the analysis of a generated, data-loader-bound trace."""
    if not _PROFILE:
        import json
        import tempfile
        from pathlib import Path

        from trace_gen import make_trace, write_trace

        from gpuwatch.analysis.trace import analyse_files

        with tempfile.TemporaryDirectory() as d:
            path = write_trace(Path(d) / "t.json", make_trace(loader_us=4000.0, seed=7))
            result = analyse_files([path])
        bd = {**result["ranks"][0], "file": "t.json", "advice": result["advice"]}
        ops = (
            ("aten::mm", 48, 900.0, 950.0, 21_000.0, 21_000.0, 1 << 20),
            ("aten::_flash_attention_forward", 12, 300.0, 320.0, 7_700.0, 7_700.0, 0),
        )
        _PROFILE.append(
            ProfileRow(
                run_id,
                "train-llama",
                1,
                NOW - 60_000,
                "on_demand",
                40,
                5,
                "/runs/r/profiles/on_demand.json.gz",
                812_000,
                ops,
                1,
                json.dumps(bd),
            )
        )
    return replace(_PROFILE[0], run_id=run_id)


class FixedSource:
    """Answers every poll with the same data; records what was asked for."""

    def __init__(self, child_pid: int | None = None, gpus: bool = True) -> None:
        self.child_pid, self.gpus = child_pid, gpus
        self.views: list[View] = []
        self.closed = False

    def fetch(self, view: View) -> Snapshot:
        self.views.append(view)
        base = Snapshot(
            now_ms=NOW,
            data_ms=NOW - 1000,
            driver=self.gpus,
            host=HostRow(23.0, 4.1, 300 * GiB, 1024 * GiB, 12 * GiB, 512 * GiB),
        )
        if view.kind == "overview":
            return replace(base, gpus=_gpus() if self.gpus else (), processes=_processes(self.child_pid))
        if view.kind == "runs":
            return replace(base, runs=RUNS, runs_total=10_002)
        if view.kind == "profile":
            return replace(base, profile=_profile(view.run_id))
        return replace(base, detail=_detail(view.run_id, view.range_s))

    def close(self) -> None:
        self.closed = True


def _app(source=None, **kw) -> GpuwatchApp:
    return GpuwatchApp(source or FixedSource(), refresh_s=0.05, **kw)


def _cells(table, column: int) -> list[str]:
    return [str(table.get_row_at(i)[column]) for i in range(table.row_count)]


@pilot_test
async def test_overview_shows_gpus_states_and_processes_by_memory():
    app = _app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        table = app.screen.query_one("#processes")
        assert _cells(table, 0) == ["3101", "3303", "3202"]  # biggest GPU memory first
        svg = app.export_screenshot()
        assert "power&#160;cap" in svg and "LOST" in svg and "ECC&#160;errors:&#160;2" in svg


@pilot_test
async def test_sort_by_key_and_header_click():
    app = _app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        table = app.screen.query_one("#processes")
        await pilot.press("s")  # next column after GPU MEM: SM%, biggest first
        assert _cells(table, 4) == ["95", "50", "10"]
        await pilot.press("S")
        assert _cells(table, 4) == ["10", "50", "95"]
        await pilot.click("#processes", offset=(8, 0))  # the USER header
        assert _cells(table, 1) == ["alice", "bob", "me"]
        await pilot.pause(0.2)  # a refresh keeps the chosen order
        assert _cells(table, 1) == ["alice", "bob", "me"]


@pilot_test
async def test_user_filter_and_only_mine():
    app = _app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        table = app.screen.query_one("#processes")
        await pilot.press("slash", *"bob", "enter")
        assert _cells(table, 1) == ["bob"]
        await pilot.press("m")
        assert _cells(table, 0) == ["3303"]  # uid is mine
        await pilot.press("escape")
        assert table.row_count == 3


@pilot_test
async def test_user_flag_starts_filtered():
    app = _app(user="alice")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert _cells(app.screen.query_one("#processes"), 1) == ["alice"]


@pilot_test
async def test_start_on_runs_as_the_demo_does():
    source = FixedSource()
    app = _app(source, start_mode="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "RunsScreen"
        assert app.screen.query_one("#runs").row_count == 4
        assert all(view.kind == "runs" for view in source.views)  # the overview was never fetched


@pilot_test
async def test_runs_filter_by_status_and_open_detail_with_ranges():
    source = FixedSource()
    app = _app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await pilot.pause(0.2)
        table = app.screen.query_one("#runs")
        assert table.row_count == 4
        await pilot.press("f")  # running
        assert [str(c) for c in _cells(table, 0)] == ["running", "running"]
        await pilot.press("f", "f", "f")  # finished, failed, oom
        assert _cells(table, 1) == ["seq-262k"]
        assert _cells(table, 7) == ["OOM"]
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "RunScreen"
        assert source.views[-1] == View("run", run_id="r-oom", range_s=None)
        await pilot.press("1")
        await pilot.pause(0.2)
        assert source.views[-1] == View("run", run_id="r-oom", range_s=300)
        await pilot.press("escape")
        assert type(app.screen).__name__ == "RunsScreen"


@pilot_test
async def test_hidden_screens_are_not_fetched_and_modals_pause_polling():
    source = FixedSource()
    app = _app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await pilot.pause(0.3)
        source.views.clear()
        await pilot.pause(0.3)
        assert source.views and {v.kind for v in source.views} == {"runs"}
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        source.views.clear()
        await pilot.pause(0.3)
        assert source.views == []
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert source.views


@pilot_test
async def test_signal_own_process_after_confirmation():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        app = _app(FixedSource(child_pid=child.pid))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.2)
            table = app.screen.query_one("#processes")
            table.move_cursor(row=table.get_row_index(f"2:{child.pid}"))
            await pilot.press("k")
            assert type(app.screen).__name__ == "ConfirmSignal"
            await pilot.press("enter")  # focus starts on Cancel: a reflexive Enter sends nothing
            assert child.poll() is None
            await pilot.press("k", "t")
            assert child.wait(timeout=5) == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


@pilot_test
async def test_signal_refused_for_another_users_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Fixed data says the process belongs to someone else: the TUI must refuse.
        app = _app(FixedSource(child_pid=child.pid), uid=OTHER + 1)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.2)
            table = app.screen.query_one("#processes")
            table.move_cursor(row=table.get_row_index("0:3101"))
            await pilot.press("k")
            await pilot.pause(0.1)
            assert type(app.screen).__name__ == "OverviewScreen"
            notes = [n.message for n in app._notifications]
            assert any("belongs to alice" in m and "only your own" in m for m in notes)
            assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pilot_test
async def test_no_driver_says_so_and_still_shows_host():
    app = _app(FixedSource(gpus=False))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        svg = app.export_screenshot()
        assert "No&#160;NVIDIA&#160;driver" in svg and "RAM" in svg


@pilot_test
async def test_stale_data_says_daemon_not_running():
    class Stale(FixedSource):
        def fetch(self, view):
            return replace(super().fetch(view), data_ms=NOW - 12 * 60_000)

    app = _app(Stale())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert (
            "daemon&#160;not&#160;running:&#160;data&#160;is&#160;12&#160;min&#160;old"
            in app.export_screenshot()
        )


@pilot_test
async def test_source_failure_is_shown_not_fatal():
    class Broken(FixedSource):
        def fetch(self, view):
            raise OSError("disk I/O error")

    app = _app(Broken())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        assert "disk&#160;I/O&#160;error" in app.export_screenshot()
        await pilot.press("q")
    assert app.return_code == 0


# -- snapshots: every screen at 80x24 and 160x48, fixed data and clock --------------------------

SCREENS = {
    "overview": [],
    "runs": ["r"],
    "run": ["r", "enter"],
    "help": ["question_mark"],
    "signal": ["k"],
    "profile": ["r", "enter", "p"],
}


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen_snapshots(snap_compare, screen, size):
    async def settle(pilot):
        await pilot.pause(0.2)

    keys = SCREENS[screen]
    assert snap_compare(
        GpuwatchApp(FixedSource(), refresh_s=60),
        press=["_", *keys, "_"],
        terminal_size=size,
        run_before=settle,
    )

"""The TUI's OOM postmortem screen: reached from the runs table and from a run, fed fixed data;
the store-backed source turns a stored postmortem into what the screen shows."""

from __future__ import annotations

import io
import os
from dataclasses import replace

from rich.console import Console
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from gpuwatch.store import open_rw
from gpuwatch.store.events import Peer, apply_events
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.screens.oom import OomScreen
from gpuwatch.tui.snapshot import OomRow, RunRow, Snapshot, View
from gpuwatch.tui.source import StoreSource

NOW = 1_764_676_800_000  # 2025-12-02 12:00:00 UTC
GiB = 2**30
MiB = 2**20

RUNS = (
    RunRow(
        "r-oom", "seq-262k", "alice", "oom", NOW - 86_400_000, NOW - 86_000_000, None, 30_000, 79 * GiB, True
    ),
    RunRow("r-done", "baseline", "bob", "finished", NOW - 2 * 86_400_000, NOW - 86_300_000),
)

POSTMORTEM = OomRow(
    run_id="r-oom",
    run_name="seq-262k",
    ts_ms=NOW - 86_000_000,
    kind="gpu",
    device=3,
    requested_bytes=32 * GiB,
    free_bytes=6 * GiB,
    total_bytes=80 * GiB,
    allocated_bytes=52 * GiB,
    reserved_bytes=72 * GiB,
    step=41,
    seq_len=262144,
    batch=1,
    phase="backward",
    neighbours=((3303, "bob", 20 * GiB, "bob-eval"), (3404, "carol", 512 * MiB, None)),
    advice=(
        (
            "Fragmented allocator cache",
            "20.0 GiB reserved but unallocated (72.0 GiB reserved, "
            "52.0 GiB allocated); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        ),
        ("Another process holds memory on this GPU", "pid 3303 (bob) with 20.0 GiB"),
    ),
    blocks=((16 * GiB, "/work/model.py:51 attend"), (8 * GiB, "/work/model.py:88 mlp")),
    traceback_tail=(
        '  File "/work/train.py", line 210, in train',
        "    loss.backward()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 GiB",
    ),
)


class FixedSource:
    def __init__(self) -> None:
        self.views: list[View] = []

    def fetch(self, view: View) -> Snapshot:
        self.views.append(view)
        base = Snapshot(now_ms=NOW, data_ms=NOW - 1000)
        if view.kind == "runs":
            return replace(base, runs=RUNS)
        if view.kind == "oom":
            return replace(base, postmortems=(POSTMORTEM,) if view.run_id == "r-oom" else ())
        return base

    def close(self) -> None:
        pass


def shown(screen, selector: str) -> str:
    """What a Static shows, as plain text (rendered wide, so nothing is cut)."""
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(screen.query_one(selector).content)
    return console.file.getvalue()


@pilot_test
async def test_oom_screen_from_the_runs_table_shows_figures_neighbours_and_advice():
    source = FixedSource()
    app = GpuwatchApp(source, refresh_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r")
        await pilot.pause(0.2)
        await pilot.press("O")  # the cursor is on the OOM run
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, OomScreen)
        assert source.views[-1] == View("oom", run_id="r-oom")
        head = shown(screen, "#oom-head")
        assert "seq-262k (r-oom)" in head and "step 41 · backward · seq_len 262144" in head
        memory = shown(screen, "#oom-memory")
        assert "32.0 GiB" in memory and "6.0 GiB on GPU 3" in memory
        assert "72.0 GiB (20.0 GiB cached, unallocated)" in memory
        neighbours = shown(screen, "#oom-neighbours")
        assert neighbours.index("3303") < neighbours.index("3404")  # biggest first, as stored
        assert "bob-eval" in neighbours
        advice = shown(screen, "#oom-advice")
        assert "1. Fragmented allocator cache" in advice and "expandable_segments:True" in advice
        rest = shown(screen, "#oom-rest")
        assert "16.0 GiB  /work/model.py:51 attend" in rest and "loss.backward()" in rest
        await pilot.press("escape")
        assert type(app.screen).__name__ == "RunsScreen"


@pilot_test
async def test_oom_key_on_a_run_without_postmortem_says_so():
    source = FixedSource()
    app = GpuwatchApp(source, refresh_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("r", "down", "enter")
        await pilot.pause(0.2)
        assert type(app.screen).__name__ == "RunScreen"
        await pilot.press("O")
        await pilot.pause(0.2)
        assert source.views[-1] == View("oom", run_id="r-done")
        assert "run r-done has no OOM postmortem" in shown(app.screen, "#oom-head")


def test_oom_screen_snapshot_80x24(snap_compare):
    async def settle(pilot):
        await pilot.pause(0.2)

    assert snap_compare(
        GpuwatchApp(FixedSource(), refresh_s=60),
        press=["r", "O", "_"],
        terminal_size=(80, 24),
        run_before=settle,
    )


def test_store_source_builds_the_screen_rows_from_a_stored_postmortem(tmp_path):
    db = tmp_path / "gw.db"
    conn = open_rw(db)
    peer = Peer(uid=os.getuid(), user="me", pid=10, mode="embedded")
    events = [
        {"id": "s", "kind": "run_start", "run_id": "host1", "ts_ms": 1000, "name": "tiny"},
        {
            "id": "o",
            "kind": "oom_postmortem",
            "run_id": "host1",
            "ts_ms": 2000,
            "oom_kind": "host",
            "requested_bytes": 4 * GiB,
            "rss_bytes": 300 * MiB,
            "available_bytes": 20 * GiB,
            "stats": {"rlimit_as_bytes": 3 * GiB, "vms_bytes": 2 * GiB},
            "phase": "forward",
            "traceback": "Traceback\n  line a\nRuntimeError: DefaultCPUAllocator: can't allocate memory",
            "advice": [{"title": "Smaller batch", "detail": "batch 4 -> 2"}],
        },
    ]
    assert not apply_events(conn, events, peer).rejected
    conn.commit()
    conn.close()
    source = StoreSource(str(db), clock=lambda: NOW)
    try:
        [row] = source.fetch(View("oom", run_id="tiny")).postmortems
        assert source.fetch(View("oom", run_id="nope")).postmortems == ()
    finally:
        source.close()
    assert (row.run_id, row.kind, row.requested_bytes) == ("host1", "host", 4 * GiB)
    assert row.free_bytes == 1 * GiB  # RLIMIT_AS less address space: tighter than 20 GiB available
    assert row.advice == (("Smaller batch", "batch 4 -> 2"),)
    assert row.traceback_tail[-1].startswith("RuntimeError: DefaultCPUAllocator")
    assert row.neighbours is None

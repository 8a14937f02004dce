"""The TUI's store-backed source against a real SQLite file written by the store's Writer."""

from __future__ import annotations

from test_tui_terminal import populate, write_tick
from tui_pilot import pilot_test

from gpuwatch.store import Writer
from gpuwatch.tui.snapshot import View
from gpuwatch.tui.source import StoreSource

NOW = 1_764_676_800_000


def _db(tmp_path, gpus: bool = True):
    path = tmp_path / "gw.db"
    writer = Writer(path)
    populate(writer, NOW, n_gpus=8 if gpus else 0)
    for k in range(10):
        write_tick(writer, NOW - 10_000 + k * 1000, n_gpus=8 if gpus else 0)
    writer.flush()
    writer.close()
    return path


def test_overview_from_the_store(tmp_path):
    source = StoreSource(str(_db(tmp_path)), clock=lambda: NOW)
    snap = source.fetch(View("overview"))
    assert snap.problem is None and snap.staleness() is None
    assert [g.index for g in snap.gpus] == list(range(8))
    assert snap.gpus[7].problems() == ["power cap"] and snap.gpus[0].problems() == []
    # 5-second slots aligned to the clock, the last one the slot now filling; 10 s of samples.
    history = snap.gpus[3].util_history
    assert len(history) == 60
    assert [i for i, v in enumerate(history) if v is not None] == [57, 58]
    assert len(snap.processes) == 50
    mine = next(p for p in snap.processes if p.pid == 10_003)
    assert (mine.user, mine.run_name, mine.cmdline) == ("dave", "exp-03", "python train.py --shard 3")
    assert snap.host.mem_total_bytes == 512 * 2**30


def test_runs_and_run_detail_ranges(tmp_path):
    source = StoreSource(str(_db(tmp_path)), clock=lambda: NOW)
    runs = source.fetch(View("runs")).runs
    assert len(runs) == 20 and runs[0].run_id == "run-00"
    whole = source.fetch(View("run", run_id="run-00")).detail
    titles = [c.title for c in whole.charts]
    assert titles[:3] == ["tokens/s", "step time", "memory"] and "GPU 0 utilisation" in titles
    memory = whole.charts[2]
    assert [s.label for s in memory.series] == ["allocated", "reserved", "peak"]
    assert len(memory.series[0].points) == 120
    assert dict(whole.config) == {"lr": "0.0003", "seq": "65536"}
    last5 = source.fetch(View("run", run_id="run-00", range_s=300)).detail
    assert last5.since_ms == NOW - 300_000
    assert source.fetch(View("run", run_id="nope")).detail is None


def test_stale_store_and_no_driver(tmp_path):
    path = _db(tmp_path, gpus=False)
    snap = StoreSource(str(path), clock=lambda: NOW + 12 * 60_000).fetch(View("overview"))
    assert not snap.driver and snap.gpus == ()
    assert snap.host is not None
    assert snap.staleness() == "daemon not running: data is 12 min old; live again by itself when it is back"


def test_missing_database_is_a_message_then_recovers(tmp_path):
    path = tmp_path / "later.db"
    source = StoreSource(str(path), clock=lambda: NOW)
    snap = source.fetch(View("overview"))
    assert "no such database" in snap.problem and snap.staleness() == snap.problem
    Writer(path).close()
    assert source.fetch(View("overview")).problem is None


@pilot_test
async def test_runs_title_says_how_many_of_all_the_runs_it_lists(tmp_path):
    from gpuwatch.tui.app import GpuwatchApp

    path = tmp_path / "many.db"
    writer = Writer(path)
    populate(writer, NOW, n_runs=205)  # more than the newest 200 the Runs screen reads
    writer.close()
    app = GpuwatchApp(StoreSource(str(path), clock=lambda: NOW), refresh_s=60, start_mode="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        title = str(app.screen.query_one("#runs-title").render())
        assert title.startswith("Runs: 200 of 205 ·")
        await pilot.press("f")  # running only: a filter over the runs read, and it says so
        title = str(app.screen.query_one("#runs-title").render())
        assert title.startswith("Runs: 43 of the newest 200 of 205 · status running")

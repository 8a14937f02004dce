"""What keeps the TUI cheap over SSH and on the CPU: lines repaint only the columns that changed,
and the sparklines are kept between polls (each poll reads only the newest samples)."""

from __future__ import annotations

import pytest
from rich.text import Text

from gpuwatch.store import Writer, open_ro, queries
from gpuwatch.tui.screens.base import changed_cells
from gpuwatch.tui.sparks import SPARK_POINTS, SPARK_SLOT_MS, SPARK_WINDOW_MS, SparkHistory, window_start

NOW = 1_764_676_800_000


class Polled:
    """A TUI data source whose every poll answers `snapshot()`."""

    def __init__(self, snapshot) -> None:
        self.snapshot = snapshot

    def fetch(self, view):
        return self.snapshot()

    def close(self):
        pass


def test_changed_cells_spans_only_what_differs():
    old = Text("  0 ") + Text("███", style="green") + Text("  53% ok")
    assert changed_cells(old, Text("  0 ") + Text("███", style="green") + Text("  54% ok")) == (10, 11)
    # same characters, another colour: still a change
    assert changed_cells(old, Text("  0 ") + Text("███", style="red") + Text("  53% ok")) == (4, 7)
    # a longer text moves the tail: repaint to the end of the line
    assert changed_cells(old, Text("  0 ") + Text("███", style="green") + Text(" 100% ok!")) == (8, None)


def _util(ts: int, gpu: int) -> int:
    return (ts // 1000 + 17 * gpu) % 101


def _tick(writer: Writer, ts: int, gpus: int = 3) -> None:
    writer.insert(
        "gpu_samples", [dict(gpu_index=i, ts_ms=ts, gpu_util_pct=_util(ts, i)) for i in range(gpus)]
    )


def _reference(conn, gpu: int, now: int) -> tuple[float | None, ...]:
    """The sparkline read the slow way: a full five-minute series query."""
    start = window_start(now)
    out: list[float | None] = [None] * SPARK_POINTS
    for p in queries.gpu_series(conn, gpu, "gpu_util_pct", start, start + SPARK_WINDOW_MS, SPARK_POINTS):
        out[(p.ts_ms - start) // SPARK_SLOT_MS] = p.avg
    return tuple(out)


def test_kept_sparklines_match_a_full_read_as_samples_arrive(tmp_path):
    db = tmp_path / "gw.db"
    writer = Writer(db)
    for k in range(400):  # older than the window too, and a gap of 40 s
        if not 200 <= k < 240:
            _tick(writer, NOW - 400_000 + k * 1000)
    writer.flush()
    conn = open_ro(db)
    history = SparkHistory()
    now = NOW
    for step in range(12):  # polls while a writer adds a tick a second (and one late GPU)
        got = history.update(conn, [0, 1, 2], now)
        for gpu in range(3):
            assert got[gpu] == _reference(conn, gpu, now), (step, gpu)
        assert sum(v is None for v in got[0]) >= 7  # the gap stays a gap while it is in the window
        now += 1000
        _tick(writer, now - 500, gpus=2)
        writer.insert("gpu_samples", [dict(gpu_index=2, ts_ms=now - 1500, gpu_util_pct=step)])
        writer.flush()
    conn.close()
    writer.close()


def test_process_figures_update_in_place(tmp_path):
    """A new process tick with the same processes changes the figures where they are: the
    cursor stays on the process the user selected, and a wider figure widens its column."""
    import asyncio
    import itertools

    from textual.widgets.data_table import ColumnKey

    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.cell_table import CellTable
    from gpuwatch.tui.snapshot import ProcessRow, Snapshot

    ticks = itertools.count()

    def ticking():
        n = next(ticks)
        procs = tuple(
            ProcessRow(
                0,
                100 + k,
                1000,
                "alice",
                (10 - k) * 2**30,
                (n * 7 + k) % 100,
                float(9 if n == 0 else 10_000 * n + k),
                None,
                f"python job{k}.py",
            )
            for k in range(5)
        )
        return Snapshot(now_ms=NOW, data_ms=NOW, processes=procs)

    async def scenario():
        app = GpuwatchApp(Polled(ticking), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.5)
            table = app.screen.query_one("#processes", CellTable)
            table.move_cursor(row=2, animate=False)
            chosen = app.screen.selected_process().pid
            seen = next(ticks)  # polls so far, and one skipped: the next fetch is a new tick
            await pilot.pause(0.6)
            assert app.screen.selected_process().pid == chosen
            shown = str(table.get_cell(f"0:{chosen}", "5"))
            assert int(shown) >= 10_000 * (seen + 1)  # a later tick, wider than the header
            assert table.columns[ColumnKey("5")].content_width >= len(shown)
            assert table.row_count == 5

    asyncio.run(scenario())


def test_changed_figures_are_drawn_new_in_sight_and_after_scrolling_to_them():
    """Rendered cells are kept between process ticks and only rows in sight are repainted: what
    is drawn must still be each process's newest figure, on screen and once scrolled to."""
    import asyncio

    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.cell_table import CellTable
    from gpuwatch.tui.snapshot import ProcessRow, Snapshot

    sm = [10]

    def forty_processes():
        procs = tuple(
            ProcessRow(
                0, 100 + k, 1000, "alice", (40 - k) * 2**30, sm[0] + k % 3, 1.0, None, f"python job{k}.py"
            )
            for k in range(40)
        )
        return Snapshot(now_ms=NOW, data_ms=NOW, processes=procs)

    def drawn(table: CellTable) -> dict[str, str]:
        """pid -> the SM% drawn on its row, for the rows on screen."""
        rows = {}
        for y in range(table.header_height, table.size.height):
            cells = table.render_line(y).text.split()
            if cells:
                rows[cells[0]] = cells[5]  # PID USER GPU n GiB SM%
        return rows

    async def scenario():
        app = GpuwatchApp(Polled(forty_processes), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.5)
            table = app.screen.query_one("#processes", CellTable)
            top = drawn(table)
            assert len(top) < 40 and top["100"] == "10" and top["101"] == "11"
            repainted = []
            refresh = table.refresh
            table.refresh = lambda *regions, **kw: (repainted.extend(regions), refresh(*regions, **kw))[1]
            sm[0] = 70
            await pilot.pause(0.5)
            assert drawn(table) == {pid: str(int(v) + 60) for pid, v in top.items()}
            # each row in sight repainted, none out of sight
            assert sorted(r.y for r in repainted) == list(range(table.header_height, table.size.height))
            table.move_cursor(row=39, animate=False)  # rows updated out of sight
            await pilot.pause(0.2)
            bottom = drawn(table)
            assert "139" in bottom and all(v == str(70 + (int(pid) - 100) % 3) for pid, v in bottom.items())

    asyncio.run(scenario())


def test_sparkline_shifts_only_when_a_new_column_is_due():
    """60 slots of 5 s in 20 columns: 15 s a column. As the window slides a slot at a time, the
    drawn columns move only every third slot; in between only the newest column may change."""
    from gpuwatch.tui.panels import spark_columns

    values = {slot: float(slot * 37 % 100) for slot in range(1000, 1200)}
    drawn = []
    for first in range(1000, 1012):
        history = tuple(values[first + k] for k in range(60))
        drawn.append(spark_columns(history, first, 20))
    for before, after, first in zip(drawn, drawn[1:], range(1001, 1012)):
        new_column = (first + 59) % 3 == 0
        if new_column:
            assert after[:-1] == before[1:]  # everything moved one column left
        else:
            assert after[:-1] == before[:-1]  # nothing moved; the newest column filled up
    assert all(len(d) == 20 for d in drawn)


def spy_on_repaints(monkeypatch) -> list[str]:
    """What each repaint of a Lines widget writes from now on (Textual writes a region from its
    widget's left edge)."""
    from gpuwatch.tui.screens.base import Lines

    repainted: list[str] = []
    original = Lines.refresh

    def spy(self, *regions, **kwargs):
        repainted.extend(self.texts[r.y].plain[: r.right] for r in regions)
        if not regions:
            repainted.extend(t.plain for t in self.texts)
        return original(self, *regions, **kwargs)

    monkeypatch.setattr(Lines, "refresh", spy)
    return repainted


def test_a_new_utilisation_repaints_that_figure_alone(monkeypatch):
    """Over SSH a GPU line is no longer resent from its left edge: only the cells whose text
    changed (here GPU 0's utilisation figure) are repainted."""
    import asyncio

    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.snapshot import GpuRow, Snapshot

    util = [53]

    def two_gpus():
        gpus = tuple(
            GpuRow(
                index=i,
                name="H100",
                util_pct=util[0] if i == 0 else 20,
                util_history=(50.0,) * 60,
                mem_used_bytes=2**33,
                mem_total_bytes=2**36,
                temp_c=50,
                power_mw=300_000,
                power_limit_mw=700_000,
            )
            for i in range(2)
        )
        return Snapshot(now_ms=NOW, data_ms=NOW, gpus=gpus)

    async def scenario():
        app = GpuwatchApp(Polled(two_gpus), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.1)
            repainted = spy_on_repaints(monkeypatch)
            util[0] = 54
            await pilot.pause(0.5)
            assert repainted == ["  54"], repainted  # the utilisation column, to its changed digit

    asyncio.run(scenario())


def test_a_new_second_repaints_the_clock_alone(monkeypatch):
    """The status line's words stay put while its clock ticks: only the eight characters of the
    clock are repainted, not "live · updated " before them."""
    import asyncio

    from gpuwatch.base import fmt
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.snapshot import Snapshot

    data_ms = [NOW]

    async def scenario():
        app = GpuwatchApp(Polled(lambda: Snapshot(now_ms=data_ms[0], data_ms=data_ms[0])), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.1)
            assert (
                app.screen.query_one("#status").text.plain == f"live · updated {fmt.local_time(NOW, False)}"
            )
            repainted = spy_on_repaints(monkeypatch)
            data_ms[0] = NOW + 1000
            await pilot.pause(0.5)
            assert repainted == [fmt.local_time(NOW + 1000, False)], repainted

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_process_table_left_open_does_not_grow():
    """Each process tick changes SM% and CPU% of every row; DataTable keeps every tick's
    rendered cells under a new key, so a TUI left open for hours must keep only what the
    current screen shows."""
    import asyncio

    from textual.app import App

    from gpuwatch.tui.cell_table import CellTable

    class Table(App):
        def compose(self):
            yield CellTable(cursor_type="row")

    async def scenario():
        app = Table()
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one(CellTable)
            for c in range(8):
                table.add_column(str(c), key=str(c))
            for r in range(50):
                table.add_row(*(f"{r}-{c}" for c in range(8)), key=str(r))
            await pilot.pause()
            for tick in range(60):
                table.update_cells(
                    [(str(r), str(c), f"{(r * tick + c) % 100}") for r in range(50) for c in (4, 5)]
                )
                await pilot.pause()
            assert str(table.get_row_at(49)[4]) == f"{(49 * 59 + 4) % 100}"  # the last tick is shown
            held = (len(table._cell_render_cache), len(table._row_render_cache), len(table._line_cache))
            # Sixty ticks of 50 rows: 24,000 cells rendered; the caches hold one screen at most.
            visible = table.size.height
            assert held[0] <= visible * 8 and held[1] <= visible and held[2] <= visible, held

    asyncio.run(scenario())


def test_an_unchanged_store_is_not_read_again_and_a_change_is_seen_at_once(tmp_path):
    from gpuwatch.tui.snapshot import View
    from gpuwatch.tui.source import StoreSource

    db = tmp_path / "gw.db"
    writer = Writer(db)
    writer.insert("gpus", [dict(gpu_index=0, uuid="GPU-0", name="H100", first_seen_ms=NOW, last_seen_ms=NOW)])
    _tick(writer, NOW, gpus=1)
    writer.flush()
    clock = [NOW + 500]
    source = StoreSource(str(db), clock=lambda: clock[0])
    first = source.fetch(View("overview"))
    statements: list[str] = []
    source.conn.set_trace_callback(statements.append)
    clock[0] += 1000
    again = source.fetch(View("overview"))
    assert statements == ["PRAGMA data_version"]  # one statement a poll while nothing changes
    assert again.now_ms == clock[0] and again.gpus == first.gpus
    _tick(writer, NOW + 1000, gpus=1)
    writer.flush()
    clock[0] += 1000
    changed = source.fetch(View("overview"))
    assert changed.data_ms == NOW + 1000 and changed.gpus[0].util_pct == _util(NOW + 1000, 0)
    source.close()
    writer.close()

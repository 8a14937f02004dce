"""What keeps the TUI cheap over SSH and on the CPU: lines repaint only the columns that changed,
and the sparklines are kept between polls (each poll reads only the newest samples)."""

from __future__ import annotations

from rich.text import Text

from gpuwatch.store import Writer, open_ro, queries
from gpuwatch.tui.screens.base import changed_cells
from gpuwatch.tui.sparks import SPARK_POINTS, SPARK_SLOT_MS, SPARK_WINDOW_MS, SparkHistory, window_start

NOW = 1_764_676_800_000


def test_changed_cells_spans_only_what_differs():
    old = Text("  0 ") + Text("███", style="green") + Text("  53% ok")
    assert changed_cells(old, Text("  0 ") + Text("███", style="green") + Text("  54% ok")) == (10, 11)
    # same characters, another colour: still a change
    assert changed_cells(old, Text("  0 ") + Text("███", style="red") + Text("  53% ok")) == (4, 7)
    # a longer text moves the tail: repaint to the end of the line
    assert changed_cells(old, Text("  0 ") + Text("███", style="green") + Text(" 100% ok!")) == (8, None)


def _tick(writer: Writer, ts: int, gpus: int = 3) -> None:
    writer.insert("gpu_samples", [dict(gpu_index=i, ts_ms=ts, gpu_util_pct=(ts // 1000 + 17 * i) % 101)
                                  for i in range(gpus)])


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

    class TickingSource:
        def fetch(self, view):
            n = next(ticks)
            procs = tuple(ProcessRow(0, 100 + k, 1000, "alice", (10 - k) * 2**30, (n * 7 + k) % 100,
                                     float(9 if n == 0 else 10_000 * n + k), None, f"python job{k}.py")
                          for k in range(5))
            return Snapshot(now_ms=NOW, data_ms=NOW, processes=procs)

        def close(self):
            pass

    async def scenario():
        app = GpuwatchApp(TickingSource(), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.5)
            table = app.screen.query_one("#processes", CellTable)
            table.move_cursor(row=2, animate=False)
            chosen = app.screen.selected_process().pid
            seen = next(ticks)  # polls so far, and one skipped: the next fetch is a new tick
            await pilot.pause(0.6)
            assert app.screen.selected_process().pid == chosen
            shown = table.get_cell(f"0:{chosen}", "5")
            assert int(shown) >= 10_000 * (seen + 1)  # a later tick, wider than the header
            assert table.columns[ColumnKey("5")].content_width >= len(shown)
            assert table.row_count == 5

    asyncio.run(scenario())

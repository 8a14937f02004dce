"""The TUI shows alerts: a line at the top of every screen, and the Alerts screen (key a), read
from a real store through the real source."""

from __future__ import annotations

import pytest
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from gpuwatch.store import alerts, insert_rows, open_rw
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.source import StoreSource

NOW = 1_764_676_800_000  # 2025-12-02 12:00:00 UTC


def _store(path) -> None:
    conn = open_rw(path)
    with conn:
        insert_rows(conn, "host_samples", [dict(ts_ms=NOW - 500, cpu_pct=3.0)])  # the data is live
        alerts.record(
            conn,
            alerts.Alert(
                kind="run.failed",
                incident="r1",
                ts_ms=NOW - 60_000,
                host="node7",
                uid=1000,
                run_id="r1",
                title="run train.py (r1) failed with exit status 1 on node7 (alice (uid 1000))",
                body="run train.py (r1) of alice failed.\nMore: gpuwatch show r1",
            ),
        )
        alerts.record(
            conn,
            alerts.Alert(
                kind="gpu.idle_held",
                incident="g",
                ts_ms=NOW - 30_000,
                host="node7",
                uid=1001,
                gpu_index=3,
                pid=42,
                title="GPU 3 on node7 held idle: 70.0 GiB by bob (uid 1001), pid 42, for 30m",
                body="pid 42 of bob holds 70.0 GiB of GPU 3.\nMore: gpuwatch status",
            ),
        )
    conn.close()


async def _until(pilot, predicate, seconds: float = 20.0):
    for _ in range(int(seconds / 0.05)):
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError("condition not met in time")


@pilot_test
async def test_the_top_line_tells_of_new_alerts_and_a_opens_the_list_with_each_ones_text(tmp_path):
    db = tmp_path / "gw.db"
    _store(db)
    app = GpuwatchApp(StoreSource(str(db), clock=lambda: NOW), refresh_s=60)
    async with app.run_test(size=(80, 24)) as pilot:
        status = lambda: app.screen.query_one("#status").text.plain  # noqa: E731
        await _until(pilot, lambda: "alerts in the last hour" in status())
        assert status().startswith(
            "updated 11:59:59 · ⚠ 2 alerts in the last hour (a) · 11:59:30 gpu.idle_held"
        )

        await pilot.press("a")
        await _until(
            pilot,
            lambda: (
                type(app.screen).__name__ == "AlertsScreen" and app.screen.query_one("#alerts").row_count == 2
            ),
        )
        screen = app.screen
        assert str(screen.query_one("#alerts-title").render()) == "Alerts: 2, newest first"
        table = screen.query_one("#alerts")
        assert [table.get_row_at(i)[1].plain for i in range(2)] == ["gpu.idle_held", "run.failed"]
        body = lambda: str(screen.query_one("#alert-body").render())  # noqa: E731
        await _until(pilot, lambda: "More: gpuwatch status" in body())
        await pilot.press("down")
        await _until(pilot, lambda: "More: gpuwatch show r1" in body())
        await pilot.press("o")
        await _until(pilot, lambda: type(app.screen).__name__ == "OverviewScreen")


@pilot_test
async def test_no_alerts_no_line_and_the_list_says_what_would_come(tmp_path):
    db = tmp_path / "gw.db"
    conn = open_rw(db)
    with conn:
        insert_rows(conn, "host_samples", [dict(ts_ms=NOW - 500, cpu_pct=3.0)])
    conn.close()
    app = GpuwatchApp(StoreSource(str(db), clock=lambda: NOW), refresh_s=60, start_mode="alerts")
    async with app.run_test(size=(80, 24)) as pilot:
        await _until(pilot, lambda: app.screen.query_one("#status").text.plain.startswith("live"))
        assert "Alerts: none yet" in str(app.screen.query_one("#alerts-title").render())


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_alerts_screen_snapshot(snap_compare, tmp_path, size):
    db = tmp_path / "gw.db"
    _store(db)

    async def settle(pilot):
        await _until(pilot, lambda: pilot.app.screen.query_one("#alerts").row_count == 2)
        await pilot.pause(0.2)

    app = GpuwatchApp(StoreSource(str(db), clock=lambda: NOW), refresh_s=60, start_mode="alerts")
    assert snap_compare(app, terminal_size=size, run_before=settle)

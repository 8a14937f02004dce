"""Alerts: what fired, newest first (one row per incident); the selected one's full text below."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from gpuwatch.base import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.cell_table import PlainTable
from gpuwatch.tui.screens.base import LiveScreen, StatusLine
from gpuwatch.tui.snapshot import AlertRow, Snapshot, View

KIND_STYLES = {
    "run.finished": "blue",
    "run.recovered": "green",
    "gpus.free": "green",
    "run.slow": "yellow",
    "gpu.throttled": "yellow",
    "disk.low": "yellow",
}  # else red


class AlertsScreen(LiveScreen):
    BINDINGS = [Binding("enter", "show_selected", "Details", show=False)]

    def __init__(self) -> None:
        super().__init__()
        self.rows: tuple[AlertRow, ...] = ()

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Static(id="alerts-title")
        yield PlainTable(id="alerts", cursor_type="row")
        yield Static(id="alert-body")
        yield Footer()

    def on_mount(self) -> None:
        super().on_mount()
        table = self.query_one("#alerts", DataTable)
        for name in ("WHEN", "KIND", "WHAT"):
            table.add_column(name)

    def view(self) -> View:
        return View("alerts")

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.set_status(*panels.status_line(snap))
        if previous is not None and snap.alerts == previous.alerts:
            return
        self.rows = snap.alerts
        table = self.query_one("#alerts", DataTable)
        keep = self.selected()
        table.clear()
        for a in self.rows:
            table.add_row(
                fmt.local_time(a.ts_ms),
                Text(a.kind, style=KIND_STYLES.get(a.kind, "red")),
                a.title,
                key=str(a.id),
            )
        if keep is not None and any(a.id == keep.id for a in self.rows):
            table.move_cursor(row=table.get_row_index(str(keep.id)), animate=False)
        title = (
            f"Alerts: {len(self.rows)}, newest first"
            if self.rows
            else "Alerts: none yet (runs that end, fail, OOM or stall; GPUs held idle, lost or hung)"
        )
        self.query_one("#alerts-title", Static).update(Text(title, style="bold"))
        self._show_body()

    def selected(self) -> AlertRow | None:
        table = self.query_one("#alerts", DataTable)
        if table.row_count == 0:
            return None
        row = table.cursor_coordinate.row
        return self.rows[row] if 0 <= row < len(self.rows) else None

    def _show_body(self) -> None:
        a = self.selected()
        self.query_one("#alert-body", Static).update(Text(a.body) if a else Text())

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_body()

    def action_show_selected(self) -> None:
        self._show_body()

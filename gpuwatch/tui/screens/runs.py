"""Runs: every tracked run, newest first, filterable by status and user; Enter opens one."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input, Static

from gpuwatch.base import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.cell_table import PlainTable
from gpuwatch.tui.screens.base import StatusLine, UserFiltered
from gpuwatch.tui.snapshot import RunRow, Snapshot, View

STATUSES = (None, "running", "finished", "failed", "oom", "killed", "lost")


def runs_count(shown: int, snap: Snapshot | None) -> str:
    """'200 of 10,002' when the newest runs read are fewer than the database holds; a filter
    searches only those read, so it says so."""
    read = len(snap.runs) if snap else 0
    total = snap.runs_total if snap and snap.runs_total is not None else read
    if total <= read:
        return f"{shown:,}"
    if shown == read:
        return f"{shown:,} of {total:,}"
    return f"{shown:,} of the newest {read:,} of {total:,}"


class RunsScreen(UserFiltered):
    TABLE = "#runs"
    BINDINGS = [
        Binding("f", "cycle_status", "Status"),
        Binding("slash", "filter_user", "Filter"),
        Binding("m", "only_mine", "Mine"),
        Binding("enter", "open_run", "Open run", show=False),
        Binding("O", "open_oom", "OOM"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.status_filter: str | None = None
        self.snapshot: Snapshot | None = None

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Static(id="runs-title")
        yield PlainTable(id="runs", cursor_type="row")
        yield Input(
            placeholder="show runs of user (empty = all), Enter to apply", id="user-filter", classes="hidden"
        )
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#runs", DataTable)
        # Start time last: at 80 columns the figures and the OOM marker matter more.
        for name in (
            "STATUS",
            "NAME",
            "USER",
            "DURATION",
            "TOK/S NOW",
            "TOK/S AVG",
            "PEAK MEM",
            "OOM",
            "STARTED",
        ):
            table.add_column(name)

    def view(self) -> View:
        return View("runs")

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.snapshot = snap
        self.set_status(*panels.status_line(snap))
        if previous is None or (snap.runs, snap.now_ms) != (previous.runs, previous.now_ms):
            self._fill()

    def visible_runs(self) -> list[RunRow]:
        rows = list(self.snapshot.runs) if self.snapshot else []
        if self.status_filter:
            rows = [r for r in rows if r.status == self.status_filter]
        if self.app.only_mine:
            rows = [r for r in rows if r.user == self.app.my_user]
        elif self.app.user_filter:
            rows = [r for r in rows if r.user == self.app.user_filter]
        return rows

    def _fill(self) -> None:
        table = self.query_one("#runs", DataTable)
        now = self.snapshot.now_ms if self.snapshot else 0
        rows = self.visible_runs()
        keep = self.selected_run_id()
        table.clear()
        for r in rows:
            live = r.status == "running"
            table.add_row(
                panels.status_text(r.status),
                r.name or r.run_id[:12],
                r.user or "-",
                fmt.duration(panels.run_duration_ms(r, now)),
                fmt.count(r.tokens_per_s_last) if live else "",
                fmt.count(r.tokens_per_s_avg),
                fmt.size(r.peak_mem_bytes),
                Text("OOM", style="bold red") if r.oom else "",
                fmt.local_time(r.started_ms),
                key=r.run_id,
            )
        if keep and any(r.run_id == keep for r in rows):
            table.move_cursor(row=table.get_row_index(keep), animate=False)
        scope = (
            "only mine"
            if self.app.only_mine
            else f"user {self.app.user_filter}"
            if self.app.user_filter
            else "all users"
        )
        self.query_one("#runs-title", Static).update(
            Text(
                f"Runs: {runs_count(len(rows), self.snapshot)} · status {self.status_filter or 'any'} · {scope}",
                style="bold",
            )
        )

    def selected_run_id(self) -> str | None:
        table = self.query_one("#runs", DataTable)
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # cursor outside the table after a refresh emptied it
            return None

    def action_cycle_status(self) -> None:
        self.status_filter = STATUSES[(STATUSES.index(self.status_filter) + 1) % len(STATUSES)]
        self._fill()

    def action_clear_filter(self) -> None:
        self.status_filter = None
        super().action_clear_filter()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_run()

    def action_open_oom(self) -> None:
        from gpuwatch.tui.screens.oom import OomScreen

        run_id = self.selected_run_id()
        if run_id:
            self.app.push_screen(OomScreen(run_id))

    def action_open_run(self) -> None:
        from gpuwatch.tui.screens.run import RunScreen

        run_id = self.selected_run_id()
        if run_id:
            self.app.push_screen(RunScreen(run_id))

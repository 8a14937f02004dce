"""Overview: every GPU, the host, and the GPU process table (sortable, filterable, signal-able)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input

from gpuwatch.base import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.cell_table import CellTable
from gpuwatch.tui.screens.base import CellColumns, Line, StatusLine, UserFiltered
from gpuwatch.tui.snapshot import ProcessRow, Snapshot, View

# (header, sort key); None sorts last whichever the direction.
PROCESS_COLUMNS = (
    ("PID", lambda p: p.pid),
    ("USER", lambda p: p.user or ""),
    ("GPU", lambda p: p.gpu_index),
    ("GPU MEM", lambda p: p.used_mem_bytes or 0),
    ("SM%", lambda p: p.sm_util_pct or 0),
    ("CPU%", lambda p: p.cpu_pct or 0),
    ("RUN", lambda p: p.run_name or ""),
    ("COMMAND", lambda p: p.cmdline or ""),
)


def process_cells(p: ProcessRow) -> tuple[str, ...]:
    """A process row as the table shows it, one string per PROCESS_COLUMNS entry."""
    return (
        str(p.pid),
        p.user or str(p.uid or "-"),
        fmt.gpu_label(p.gpu_index, p.gpu_instance_id, p.compute_instance_id),
        fmt.size(p.used_mem_bytes),
        "-" if p.sm_util_pct is None else f"{p.sm_util_pct:.0f}",
        "-" if p.cpu_pct is None else f"{p.cpu_pct:.0f}",
        p.run_name or "",
        p.cmdline or "",
    )


class OverviewScreen(UserFiltered):
    TABLE = "#processes"
    BINDINGS = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("slash", "filter_user", "Filter"),
        Binding("m", "only_mine", "Mine"),
        Binding("k", "signal", "Signal"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sort_column = 3  # GPU memory, biggest first: who is using the GPUs
        self.sort_reverse = True
        self.snapshot: Snapshot | None = None
        self.shown_cells: dict[str, tuple[str, ...]] = {}  # process key -> cells, in table order

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield CellColumns(id="gpus")
        yield Line(id="host")
        yield Line(id="proc-title")
        yield CellTable(id="processes", cursor_type="row", zebra_stripes=False)
        yield Input(
            placeholder="show processes of user (empty = all), Enter to apply",
            id="user-filter",
            classes="hidden",
        )
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#processes", DataTable)
        for i, (name, _) in enumerate(PROCESS_COLUMNS):
            table.add_column(name, key=str(i))
        self.set_line("#proc-title", Text("GPU processes", style="bold"))

    def view(self) -> View:
        return View("overview")

    # -- rendering -------------------------------------------------------------------------

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.snapshot = snap
        width = self.size.width
        self.set_status(*panels.status_line(snap))
        if previous is None or (snap.gpus, snap.driver) != (previous.gpus, previous.driver):
            self._show_gpus(snap, width)
        self.set_line("#host", panels.host_line(snap.host, width))
        if previous is None or snap.processes != previous.processes:
            self._fill()

    def _show_gpus(self, snap: Snapshot, width: int) -> None:
        """A header line, then a row of cells per GPU (panels.gpu_cells), and a line per MIG
        device under its GPU."""
        if snap.gpus:
            rows = [[panels.gpu_header(width)]]
            for g in snap.gpus:
                rows.append(panels.gpu_cells(g, width))
                if g.state == "ok":  # its MIG devices, a line each
                    rows.extend([panels.mig_line(g.index, m, width)] for m in g.migs)
            widths = panels.gpu_widths(width)
        elif not snap.driver:
            rows, widths = (
                [
                    [
                        Text(
                            "No NVIDIA driver or GPU found on this host: showing host and runs only.",
                            style="yellow",
                        )
                    ]
                ],
                (),
            )
        else:
            rows, widths = [[Text("no GPU samples yet", style="dim")]], ()
        self.query_one("#gpus", CellColumns).set_rows(rows, widths)

    def _visible_processes(self) -> list[ProcessRow]:
        snap = self.snapshot
        rows = list(snap.processes) if snap else []
        user = self.app.user_filter
        if self.app.only_mine:
            rows = [p for p in rows if p.uid == self.app.my_uid]
        elif user:
            rows = [p for p in rows if p.user == user]
        key = PROCESS_COLUMNS[self.sort_column][1]
        rows.sort(key=key, reverse=self.sort_reverse)
        return rows

    def _fill(self) -> None:
        table = self.query_one("#processes", CellTable)
        rows = self._visible_processes()
        cells = {p.key: process_cells(p) for p in rows}
        if list(cells) == list(self.shown_cells):
            # The same rows in the same order (a new process tick): change only the cells that
            # differ, with no clear and re-layout of the table, and the cursor stays where it is.
            table.update_cells(
                [
                    (key, str(column), new)
                    for key, values in cells.items()
                    for column, (old, new) in enumerate(zip(self.shown_cells[key], values))
                    if old != new
                ]
            )
        else:
            selected = self.selected_process()
            table.clear()
            for key, values in cells.items():
                table.add_row(*values, key=key)
            if selected is not None and selected.key in cells:
                table.move_cursor(row=table.get_row_index(selected.key), animate=False)
        self.shown_cells = cells
        name, _ = PROCESS_COLUMNS[self.sort_column]
        arrow = "▼" if self.sort_reverse else "▲"
        scope = (
            "only mine"
            if self.app.only_mine
            else f"user {self.app.user_filter}"
            if self.app.user_filter
            else "all users"
        )
        self.set_line(
            "#proc-title",
            Text(f"GPU processes: {len(rows)} ({scope}) · sorted by {name} {arrow}", style="bold"),
        )

    def selected_process(self) -> ProcessRow | None:
        table = self.query_one("#processes", DataTable)
        if not self.snapshot or table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # cursor outside the table after a refresh emptied it
            return None
        return next((p for p in self.snapshot.processes if p.key == key), None)

    # -- actions ---------------------------------------------------------------------------

    def action_cycle_sort(self) -> None:
        self._sort_by((self.sort_column + 1) % len(PROCESS_COLUMNS))

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._fill()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        column = int(event.column_key.value)
        if column == self.sort_column:
            self.action_reverse_sort()
        else:
            self._sort_by(column)

    def _sort_by(self, column: int) -> None:
        self.sort_column = column
        self.sort_reverse = column in (3, 4, 5)  # numbers: biggest first
        self._fill()

    def action_signal(self) -> None:
        proc = self.selected_process()
        if proc is None:
            self.notify("no process selected", severity="warning")
            return
        self.app.signal_process(proc)

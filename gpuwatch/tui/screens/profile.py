"""A run's newest profile: its top operators in a table sorted by the column the user picks."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from gpuwatch import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.cell_table import PlainTable
from gpuwatch.tui.screens.base import LiveScreen, StatusLine
from gpuwatch.tui.snapshot import ProfileRow, Snapshot, View

# (header, index in ProfileRow.ops tuples, format); the sort key cycles through the numeric ones.
COLUMNS = (("OPERATOR", 0, None), ("CALLS", 1, fmt.count), ("SELF CPU", 2, "us"), ("CPU TOT", 3, "us"),
           ("SELF DEV", 4, "us"), ("DEV TOT", 5, "us"), ("MEM", 6, fmt.size))
SORTABLE = (4, 2, 5, 3, 1, 6)  # self device first: the column that says where GPU time goes


def _cell(value, how) -> str:
    if how is None:
        return value
    if how == "us":
        return fmt.duration(None if value is None else value / 1000.0)
    return how(value)


def heading(p: ProfileRow) -> Text:
    last = (p.first_step or 0) + (p.steps or 1) - 1
    text = Text("Profile ", style="bold") + Text(f"{p.run_name or '-'} ({p.run_id})", style="bold")
    text += Text(f"  {p.trigger} · steps {p.first_step}-{last} · {fmt.local_time(p.ts_ms)}"
                 + (f" · newest of {p.count}" if p.count > 1 else ""))
    if p.trace_path:
        text += Text(f"\ntrace {p.trace_path} ({fmt.size(p.trace_bytes)}; ui.perfetto.dev)", style="dim")
    elif p.trace_bytes:
        text += Text(f"\ntrace dropped: {fmt.size(p.trace_bytes)} gzipped is over profile_max_mb", style="dim")
    return text


class ProfileScreen(LiveScreen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back"),
        Binding("s", "cycle_sort", "Sort"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.sort_index = 0  # into SORTABLE

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Static(id="profile-head")
        yield PlainTable(id="profile-ops", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#profile-ops", DataTable)
        for name, index, _ in COLUMNS:
            table.add_column(name, key=str(index))

    def view(self) -> View:
        return View("profile", run_id=self.run_id)

    def action_cycle_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORTABLE)
        if self.shown is not None:
            self._fill(self.shown.profile)

    @property
    def sort_column(self) -> str:
        return COLUMNS[SORTABLE[self.sort_index]][0]

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.set_status(*panels.status_line(snap))
        if previous is not None and previous.profile == snap.profile:
            return
        self._fill(snap.profile)

    def _fill(self, profile: ProfileRow | None) -> None:
        head = self.query_one("#profile-head", Static)
        table = self.query_one("#profile-ops", DataTable)
        table.clear()
        if profile is None:
            head.update(Text(f"run {self.run_id}: no profile yet (in the run view, P asks a live run "
                             f"for one; or set profile_active in the config)", style="dim"))
            return
        head.update(heading(profile) + Text(f"\nsorted by {self.sort_column} (s: next column)", style="dim"))
        index = SORTABLE[self.sort_index]
        for op in sorted(profile.ops, key=lambda o: o[index] or 0, reverse=True):
            table.add_row(*(_cell(op[i], how) for _, i, how in COLUMNS))

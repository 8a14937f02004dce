"""A run's newest profile: the trace's breakdown (a bar, the idle's causes, advice, top kernels)
first, then its top operators in a table sorted by the column the user picks."""

from __future__ import annotations

import json

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Static

from gpuwatch.analysis.trace import render
from gpuwatch.base import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.cell_table import PlainTable
from gpuwatch.tui.screens.base import LiveScreen, StatusLine
from gpuwatch.tui.snapshot import ProfileRow, Snapshot, View

# (header, index in ProfileRow.ops tuples, format); the sort key cycles through the numeric ones.
COLUMNS = (
    ("OPERATOR", 0, None),
    ("CALLS", 1, fmt.count),
    ("SELF CPU", 2, "us"),
    ("CPU TOT", 3, "us"),
    ("SELF DEV", 4, "us"),
    ("DEV TOT", 5, "us"),
    ("MEM", 6, fmt.size),
)
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
    text += Text(
        f"  {p.trigger} · steps {p.first_step}-{last} · {fmt.local_time(p.ts_ms)}"
        + (f" · newest of {p.count}" if p.count > 1 else "")
    )
    if p.trace_path:
        text += Text(f"\ntrace {p.trace_path} ({fmt.size(p.trace_bytes)}; ui.perfetto.dev)", style="dim")
    elif p.trace_bytes:
        text += Text(
            f"\ntrace dropped: {fmt.size(p.trace_bytes)} gzipped is over profile_max_mb", style="dim"
        )
    return text


# bar part -> style; the characters differ too, so the bar reads without colour
_STYLES = {
    "compute_pct": "green",
    "non_compute_pct": "yellow",
    "idle_pct": "red",
    "operators_pct": "green",
    "dataloader_pct": "yellow",
    "optimizer_pct": "cyan",
    "other_pct": "red",
}
TOP_KERNELS = 3


def breakdown_text(bd: dict | None, width: int) -> Text:
    """The breakdown as `gpuwatch trace` prints it: the bar in colour, advice, top kernels."""
    if bd is None:
        return Text("no trace breakdown for this profile (no trace kept)", style="dim")
    shares, parts = render.shares_and_parts(bd)
    text = Text("")
    if shares:
        cells = render.bar(shares, parts, max(8, width - 2))
        text += Text("[")
        for key, ch, _ in parts:
            run = len(cells) - len(cells.lstrip(ch))
            text += Text(cells[:run], style=_STYLES[key])
            cells = cells[run:]
        text += Text(cells + "]\n") + Text(render.legend(shares, parts) + "\n")
    advice = render.advice_lines(bd.get("advice") or [], width)
    text += Text("\n".join(advice) if advice else "no advice: nothing stands out", style="bold")
    if bd.get("temporal"):  # CPU-only: the operators table below says the rest
        text += Text("\n" + "\n".join(render.detail_lines(bd, width, TOP_KERNELS)))
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
        yield Static(id="profile-breakdown")
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
        self.query_one("#profile-breakdown", Static).update(
            ""
            if profile is None
            else breakdown_text(
                None if profile.breakdown_json is None else json.loads(profile.breakdown_json),
                self.size.width - 2 if self.size.width else 78,
            )
        )
        if profile is None:
            head.update(
                Text(
                    f"run {self.run_id}: no profile yet (in the run view, P asks a live run "
                    f"for one; or set profile_active in the config)",
                    style="dim",
                )
            )
            return
        head.update(heading(profile) + Text(f"\nsorted by {self.sort_column} (s: next column)", style="dim"))
        index = SORTABLE[self.sort_index]
        for op in sorted(profile.ops, key=lambda o: o[index] or 0, reverse=True):
            table.add_row(*(_cell(op[i], how) for _, i, how in COLUMNS))

"""The newest `gpuwatch capacity` study: measured and fitted peaks, the predicted maximum length."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from gpuwatch.base import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.screens.base import LiveScreen, StatusLine
from gpuwatch.tui.snapshot import CapacityRow, Snapshot, View


def study_panel(c: CapacityRow | None) -> Group | Text:
    if c is None:
        return Text(
            "no capacity study yet: gpuwatch capacity -- python -m workloads.gpt_train ...", style="dim"
        )
    head = Text("Capacity ", style="bold") + Text(
        f"{c.device or '-'} · limit {fmt.size(c.limit_bytes)} · "
        f"margin {c.margin or 0:.0%} · {fmt.local_time(c.ts_ms)}"
    )
    cmd = Text(c.command, style="dim", overflow="ellipsis", no_wrap=True)
    table = Table(box=None, padding=(0, 1))
    for name in ("BATCH", "SEQ_LEN", "MEASURED", "FITTED", "KIND"):
        table.add_column(name, justify="left" if name == "KIND" else "right")
    for batch, seq_len, measured, fitted, kind in c.points:
        table.add_row(
            str(batch),
            str(seq_len),
            fmt.size(measured) if measured is not None else Text("OOM", style="bold red"),
            fmt.size(fitted),
            kind,
        )
    lines = [
        Text(
            f"batch {b}: max seq_len {best} (predicted {fmt.size(pred)}, measured {fmt.size(seen)})",
            style="bold",
        )
        for b, best, pred, seen in c.predictions
    ]
    return Group(head, cmd, table, *lines)


class CapacityScreen(LiveScreen):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with VerticalScroll(id="capacity-body"):
            yield Static(id="capacity")
        yield Footer()

    def view(self) -> View:
        return View("capacity")

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.set_status(*panels.status_line(snap))
        if previous is None or previous.capacity != snap.capacity:
            self.query_one("#capacity", Static).update(study_panel(snap.capacity))

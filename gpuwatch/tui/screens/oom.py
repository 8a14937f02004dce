"""A run's OOM postmortem: requested vs free, allocated/reserved, who else held the GPU, advice
worked out from the numbers, the largest live blocks and the traceback's tail."""

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
from gpuwatch.tui.snapshot import OomRow, Snapshot, View

BAR_WIDTH = 30


def _bar(value: int | None, scale: int, style: str) -> Text:
    cells = 0 if not value or not scale else max(1, round(BAR_WIDTH * min(value, scale) / scale))
    return Text("█" * cells, style=style) + Text("·" * (BAR_WIDTH - cells), style="dim")


def memory_table(pm: OomRow) -> Table:
    """Requested vs free as bars on one scale, then what the allocator or the host held."""
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=10)
    t.add_column()
    t.add_column(no_wrap=True)
    scale = max(pm.requested_bytes or 0, pm.free_bytes or 0)
    where = f"GPU {pm.device}" if pm.kind == "gpu" else "host"
    t.add_row("requested", _bar(pm.requested_bytes, scale, "bold red"), fmt.size(pm.requested_bytes))
    t.add_row("free", _bar(pm.free_bytes, scale, "green"), f"{fmt.size(pm.free_bytes)} on {where}")
    if pm.kind == "gpu":
        cached = (
            None
            if pm.reserved_bytes is None or pm.allocated_bytes is None
            else pm.reserved_bytes - pm.allocated_bytes
        )
        t.add_row("allocated", "", f"{fmt.size(pm.allocated_bytes)} of {fmt.size(pm.total_bytes)}")
        t.add_row("reserved", "", f"{fmt.size(pm.reserved_bytes)} ({fmt.size(cached)} cached, unallocated)")
    else:
        t.add_row("RSS", "", fmt.size(pm.rss_bytes))
        t.add_row("cgroup", "", f"limit {fmt.size(pm.cgroup_limit_bytes)}")
    return t


def heading(pm: OomRow, count: int) -> Text:
    text = Text("OOM postmortem ", style="bold red") + Text(
        f"{pm.run_name or '-'} ({pm.run_id})", style="bold"
    )
    text += Text(f"  {fmt.local_time(pm.ts_ms)}" + (f"  (newest of {count})" if count > 1 else ""))
    missing = fmt.MISSING
    text += Text(
        f"\n{pm.kind} · step {missing if pm.step is None else pm.step} · {pm.phase or missing}"
        f" · seq_len {missing if pm.seq_len is None else pm.seq_len}"
        f" · batch {missing if pm.batch is None else pm.batch}",
        style="dim",
    )
    return text


def neighbours_table(pm: OomRow) -> Table | Text:
    if pm.kind != "gpu":
        return Text("")
    if pm.neighbours is None:
        return Text("other processes on this GPU: unknown (NVML was not readable)", style="dim")
    if not pm.neighbours:
        return Text("other processes on this GPU: none", style="dim")
    t = Table(title="other processes on this GPU", title_justify="left", box=None, padding=(0, 1))
    for name, justify in (("PID", "right"), ("USER", "left"), ("USED", "right"), ("RUN", "left")):
        t.add_column(name, justify=justify)
    for pid, user, used, run in pm.neighbours:
        t.add_row(str(pid), Text(user or "-"), fmt.size(used), Text(run or "-"))
    return t


def advice_list(pm: OomRow) -> Group | Text:
    if not pm.advice:
        return Text("advice: none from these figures", style="dim")
    parts = [Text("advice", style="bold")]
    for i, (title, detail) in enumerate(pm.advice, 1):
        parts.append(Text(f"{i}. {title}", style="bold yellow"))
        parts.append(Text(f"   {detail}"))
    return Group(*parts)


def blocks_and_traceback(pm: OomRow) -> Group:
    parts = []
    if pm.blocks:
        parts.append(Text("largest live blocks", style="bold"))
        parts += [
            Text(f"{fmt.size(size):>10}  {frame}", overflow="ellipsis", no_wrap=True)
            for size, frame in pm.blocks[:5]
        ]
    if pm.snapshot_path:
        parts.append(Text(f"snapshot: {pm.snapshot_path} (pytorch.org/memory_viz)", style="dim"))
    if pm.traceback_tail:
        parts.append(Text("traceback (tail)", style="bold"))
        parts += [Text(line, overflow="ellipsis", no_wrap=True) for line in pm.traceback_tail]
    return Group(*parts)


class OomScreen(LiveScreen):
    BINDINGS = [Binding("escape,backspace", "app.pop_screen", "Back")]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with VerticalScroll(id="oom-body"):
            yield Static(id="oom-head")
            yield Static(id="oom-memory")
            yield Static(id="oom-advice")
            yield Static(id="oom-neighbours")
            yield Static(id="oom-rest")
        yield Footer()

    def view(self) -> View:
        return View("oom", run_id=self.run_id)

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.set_status(*panels.status_line(snap))
        if not snap.postmortems:
            self.query_one("#oom-head", Static).update(
                Text(f"run {self.run_id} has no OOM postmortem", style="bold")
            )
            return
        pm = snap.postmortems[-1]
        self.query_one("#oom-head", Static).update(heading(pm, len(snap.postmortems)))
        self.query_one("#oom-memory", Static).update(memory_table(pm))
        self.query_one("#oom-advice", Static).update(advice_list(pm))
        self.query_one("#oom-neighbours", Static).update(neighbours_table(pm))
        self.query_one("#oom-rest", Static).update(blocks_and_traceback(pm))

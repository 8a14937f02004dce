"""Fleet: every host's GPUs (or every running job) from Prometheus; sort, filter, find a free GPU.

A host whose scrape fails is one row, "unreachable since" its last stored sample. The Jobs view
(j) lists each job's total tokens/s over all its hosts, then each rank with its share of it: a
rank well under its even share is the slow one. Enter on a row shows the command that opens
that host's own TUI over SSH.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Footer, Input

from gpuwatch.base import fmt
from gpuwatch.fleet.model import Fleet, FleetGpu, FleetHost, FleetJob
from gpuwatch.tui.screens.base import Line, LiveScreen, StatusLine
from gpuwatch.tui.snapshot import Snapshot, View

FREE_UTIL_PCT = 10  # "free": no process on it and at most this busy
SLOW_SHARE = 0.8  # a rank below 80 % of its even share of the job's tokens/s is marked
# (header, width): fixed widths fit 80 columns; longer host names and user lists are cut.
GPU_COLUMNS = (
    ("HOST", 12),
    ("GPU", 3),
    ("UTIL", 4),
    ("MEM", 7),
    ("TEMP", 4),
    ("POWER", 5),
    ("STATE", 9),
    ("USERS", 28),
)
JOB_COLUMNS = (
    ("JOB", 14),
    ("USER", 8),
    ("NAME", 8),
    ("HOST", 11),
    ("RANK", 4),
    ("TOK/S", 6),
    ("SHARE", 6),
    ("STEP", 6),
    ("PEAK", 8),
)
SORTS = {
    "host": lambda g: (g.host, g.index),
    "util": lambda g: (-(g.util_pct or 0), g.host, g.index),
    "free memory": lambda g: (-(g.mem_free_bytes or 0), g.host, g.index),
    "user": lambda g: (g.users[0][0] if g.users else "~", g.host, g.index),
}
STATE_STYLES = {
    "ok": "green",
    "throttled": "yellow",
    "lost": "bold red",
    "not responding": "bold red",
    "down": "bold red",
}


def is_free(g: FleetGpu) -> bool:
    return g.state == "ok" and not g.users and g.util_pct is not None and g.util_pct <= FREE_UTIL_PCT


def gpu_cells(g: FleetGpu) -> tuple:
    used = (
        "-"
        if g.mem_used_bytes is None
        else f"{g.mem_used_bytes / 2**30:.0f}/{(g.mem_total_bytes or 0) / 2**30:.0f}G"
    )  # GiB
    return (
        g.host,
        str(g.index),
        "-" if g.util_pct is None else f"{g.util_pct:.0f}%",
        used,
        "-" if g.temp_c is None else f"{g.temp_c:.0f}C",
        "-" if g.power_w is None else f"{g.power_w:.0f}W",
        Text(g.state, style=STATE_STYLES.get(g.state, "")),
        ", ".join(f"{u} {fmt.size(b)}" for u, b in g.users) or "-",
    )


def down_cells(h: FleetHost, now_s: float) -> tuple:
    """A host whose scrape fails: since when, by the newest sample it stored (the date only
    when that is more than 20 hours ago, so that the line fits 80 columns)."""
    since = (
        "unreachable"
        if h.last_sample_s is None
        else "unreachable since "
        + fmt.local_time(int(h.last_sample_s * 1000), with_date=now_s - h.last_sample_s > 20 * 3600)
    )
    return (h.name, "-", "", "", "", "", Text("down", style=STATE_STYLES["down"]), Text(since, style="red"))


def job_rows(job: FleetJob) -> list[tuple[str, str, tuple]]:
    """(row key, host, cells): the job's total (on its first host), then each rank with its share."""
    first = job.ranks[0]
    hosts = f"{len(job.hosts)} host{'s' * (len(job.hosts) > 1)}"
    rows = [
        (
            f"job:{job.job_id}",
            job.hosts[0],
            (
                Text(job.job_id, style="bold"),
                first.user,
                first.name,
                hosts,
                f"{len(job.ranks)} rk",
                Text(fmt.count(job.tokens_per_s), style="bold"),
                "100%",
                "",
                "",
            ),
        )
    ]
    even = 1 / len(job.ranks)
    for r in job.ranks:
        share = job.share(r)
        slow = share is not None and len(job.ranks) > 1 and share < SLOW_SHARE * even
        rows.append(
            (
                f"rank:{r.host}:{r.run_id}",
                r.host,
                (
                    "",
                    "",
                    "",
                    r.host,
                    "-" if r.rank is None else str(r.rank),
                    fmt.count(r.tokens_per_s),
                    Text(fmt.percent(share), style="bold red" if slow else ""),
                    "-" if r.step is None else str(r.step),
                    fmt.size(r.peak_bytes),
                ),
            )
        )
    return rows


class RowList(Widget, can_focus=True):
    """A table that formats only the rows on screen. A fleet has a thousand GPUs and a terminal
    shows twenty of them: a DataTable would format and measure every cell of every row on each
    refresh (over a second at 800 rows), this costs the same at 8 hosts or 1000."""

    BINDINGS = [
        Binding("up", "move(-1)", show=False),
        Binding("down", "move(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "move(-1_000_000)", show=False),
        Binding("end", "move(1_000_000)", show=False),
        Binding("enter", "select", show=False),
    ]

    class Selected(Message):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, columns: tuple[tuple[str, int], ...], id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns = columns
        self.rows: list[tuple[str, tuple]] = []  # (key, cells)
        self.cursor = 0
        self.top = 0

    def set_columns(self, columns: tuple[tuple[str, int], ...]) -> None:
        self.columns, self.rows, self.cursor, self.top = columns, [], 0, 0
        self.refresh()

    def set_rows(self, rows: list[tuple[str, tuple]]) -> None:
        """New rows; the cursor stays on the same key when it is still there."""
        keep = self.selected_key()
        self.rows = rows
        keys = [k for k, _ in rows]
        self.cursor = keys.index(keep) if keep in keys else max(0, min(self.cursor, len(rows) - 1))
        self._scroll()
        self.refresh()

    def selected_key(self) -> str | None:
        return self.rows[self.cursor][0] if self.rows else None

    def _page(self) -> int:
        return max(1, self.size.height - 1)  # one line is the header

    def _scroll(self) -> None:
        page = self._page()
        if self.cursor < self.top:
            self.top = self.cursor
        elif self.cursor >= self.top + page:
            self.top = self.cursor - page + 1
        self.top = max(0, min(self.top, len(self.rows) - page))

    def action_move(self, delta: int) -> None:
        self.cursor = max(0, min(len(self.rows) - 1, self.cursor + delta))
        self._scroll()
        self.refresh()

    def action_page(self, pages: int) -> None:
        self.action_move(pages * self._page())

    def action_select(self) -> None:
        if self.rows:
            self.post_message(self.Selected(self.rows[self.cursor][0]))

    def on_mouse_scroll_down(self) -> None:
        self.action_move(3)

    def on_mouse_scroll_up(self) -> None:
        self.action_move(-3)

    def on_resize(self) -> None:
        self._scroll()

    def _line(self, cells: tuple) -> Text:
        line = Text(no_wrap=True)
        for n, ((_, width), cell) in enumerate(zip(self.columns, cells)):
            text = cell.copy() if isinstance(cell, Text) else Text(str(cell))
            text.truncate(width, overflow="ellipsis", pad=True)
            line.append(" " if n else "")
            line.append_text(text)
        return line

    def render(self) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        out.append_text(self._line(tuple(name for name, _ in self.columns)))
        out.stylize("bold")
        for i in range(self.top, min(len(self.rows), self.top + self._page())):
            line = self._line(self.rows[i][1])
            if i == self.cursor:
                line.stylize("reverse")
            out.append("\n")
            out.append_text(line)
        return out


class FleetScreen(LiveScreen):
    BINDINGS = [
        Binding("j", "toggle_jobs", "GPUs/Jobs"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("f", "only_free", "Free"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.jobs = False
        self.sort = "host"
        self.only_free = False
        self.text_filter: str | None = None
        self.snapshot: Snapshot | None = None
        self.row_hosts: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        yield Line(id="fleet-title")
        yield RowList(GPU_COLUMNS, id="fleet")
        yield Line(id="fleet-hint")
        yield Input(
            placeholder="show GPUs and jobs of this user or host (empty = all), Enter to apply",
            id="fleet-filter",
            classes="hidden",
        )
        yield Footer()

    def on_mount(self) -> None:
        super().on_mount()
        self.query_one(RowList).focus()

    def view(self) -> View:
        return View("fleet_jobs" if self.jobs else "fleet")

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.snapshot = snap
        fleet = snap.fleet
        if snap.problem or fleet is None:
            self.set_status(Text(f"⚠ {snap.problem}", style="bold yellow"))
        else:
            down = sum(not h.up for h in fleet.hosts)
            style = "bold yellow" if down else "dim"
            self.set_status(
                Text(
                    f"{fleet.url} · {len(fleet.hosts)} hosts"
                    + (f", {down} unreachable" if down else "")
                    + " · updated ",
                    style=style,
                ),
                Text(fmt.local_time(int(fleet.at_s * 1000), with_date=False), style=style),
            )
        if previous is None or previous.fleet != fleet:
            self._fill()

    # -- table -----------------------------------------------------------------------------

    def _matches(self, *names: str) -> bool:
        return not self.text_filter or any(self.text_filter in (n or "") for n in names)

    def visible_gpus(self, fleet: Fleet) -> list[FleetGpu]:
        gpus = [g for g in fleet.gpus if self._matches(g.host, *(u for u, _ in g.users))]
        if self.only_free:
            gpus = [g for g in gpus if is_free(g)]
        return sorted(gpus, key=SORTS[self.sort])

    def visible_jobs(self, fleet: Fleet) -> list[FleetJob]:
        return [j for j in fleet.jobs if any(self._matches(r.user, r.host) for r in j.ranks)]

    def _fill(self) -> None:
        fleet = self.snapshot.fleet if self.snapshot else None
        rows: list[tuple[str, tuple]] = []
        self.row_hosts = {}
        if fleet is None:
            self.query_one(RowList).set_rows(rows)
            self.set_line("#fleet-title", Text("Fleet", style="bold"))
            return
        if self.jobs:
            jobs = self.visible_jobs(fleet)
            for job in jobs:
                for key, host, cells in job_rows(job):
                    rows.append((key, cells))
                    self.row_hosts[key] = host
            title = f"Jobs: {len(jobs)} running · tokens/s summed over every rank on every host"
        else:
            gpus = self.visible_gpus(fleet)
            for g in gpus:
                key = f"gpu:{g.host}:{g.index}"
                rows.append((key, gpu_cells(g)))
                self.row_hosts[key] = g.host
            for h in fleet.hosts:
                if not h.up and not self.only_free and self._matches(h.name):
                    rows.append((f"host:{h.name}", down_cells(h, fleet.at_s)))
                    self.row_hosts[f"host:{h.name}"] = h.name
            free = sum(is_free(g) for g in fleet.gpus)
            title = f"GPUs: {len(gpus)} of {len(fleet.gpus)} · {free} free · sort {self.sort}" + (
                " · only free" if self.only_free else ""
            )
        if self.text_filter:
            title += f" · filter {self.text_filter!r}"
        self.set_line("#fleet-title", Text(title, style="bold"))
        self.query_one(RowList).set_rows(rows)

    # -- actions ---------------------------------------------------------------------------

    def on_row_list_selected(self, event: RowList.Selected) -> None:
        host = self.row_hosts.get(event.key)
        if host:
            job = event.key.split(":", 1)[1] + " · " if event.key.startswith("job:") else ""
            self.set_line(
                "#fleet-hint",
                Text.assemble((f"{job}open its TUI: ", "dim"), (f"ssh -t {host} gpuwatch tui", "bold")),
            )

    def action_toggle_jobs(self) -> None:
        self.jobs = not self.jobs
        self.query_one(RowList).set_columns(JOB_COLUMNS if self.jobs else GPU_COLUMNS)
        self._fill()
        self.app.poll_now()  # the other view reads other series

    def action_cycle_sort(self) -> None:
        names = list(SORTS)
        self.sort = names[(names.index(self.sort) + 1) % len(names)]
        self._fill()

    def action_only_free(self) -> None:
        self.only_free = not self.only_free
        self._fill()

    def action_filter(self) -> None:
        box = self.query_one("#fleet-filter", Input)
        box.remove_class("hidden")
        box.value = self.text_filter or ""
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.text_filter = event.value.strip() or None
        event.input.add_class("hidden")
        self.query_one(RowList).focus()
        self._fill()

    def action_clear_filter(self) -> None:
        self.query_one("#fleet-filter", Input).add_class("hidden")
        self.text_filter = None
        self.query_one(RowList).focus()
        self._fill()

"""One run: throughput, loss, step time (slow phases shaded, their causes listed), memory and its
GPUs over a chosen time range; energy, config, ranks, how it ended. Other run views (OOM postmortem, profiles, stack dumps) push from here."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Footer, Static

from gpuwatch.base import fmt
from gpuwatch.tui import panels
from gpuwatch.tui.chart import render_chart
from gpuwatch.tui.screens.base import LiveScreen, StatusLine
from gpuwatch.tui.snapshot import Chart, RunDetail, Snapshot, View

PROFILE_STEPS = 5
RANGES = {"1": (300, "5 min"), "2": (3600, "1 h"), "3": (86400, "24 h"), "0": (None, "whole run")}


class ChartView(Widget):
    """Renders one Chart at whatever size layout gives it."""

    def __init__(self, chart: Chart, until_ms: int) -> None:
        super().__init__(classes="chart")
        self.chart, self.until_ms = chart, until_ms

    def set_chart(self, chart: Chart, until_ms: int) -> None:
        self.chart, self.until_ms = chart, until_ms
        self.refresh()

    def render(self) -> Text:
        return render_chart(self.chart, self.size.width, self.size.height, self.until_ms)


class RunScreen(LiveScreen):
    BINDINGS = [
        Binding("escape,backspace", "app.pop_screen", "Back"),
        Binding("1", "range('1')", "5m"),
        Binding("2", "range('2')", "1h"),
        Binding("3", "range('3')", "24h"),
        Binding("0", "range('0')", "Whole"),
        Binding("O", "oom", "OOM"),
        Binding("p", "profile", "Profile"),
        Binding("P", "request_profile", "Profile now", show=False),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.range_key = "0"

    def compose(self) -> ComposeResult:
        yield StatusLine(id="status")
        with VerticalScroll(id="run-body"):
            yield Static(id="run-summary")
            yield Static(id="run-slowdowns")
            yield Static(id="run-stacks")
            yield Static(id="run-charts-title")
            yield Static(id="run-config")
        yield Footer()

    def view(self) -> View:
        return View("run", run_id=self.run_id, range_s=RANGES[self.range_key][0])

    def action_oom(self) -> None:
        from gpuwatch.tui.screens.oom import OomScreen

        self.app.push_screen(OomScreen(self.run_id))

    def action_profile(self) -> None:
        from gpuwatch.tui.screens.profile import ProfileScreen

        self.app.push_screen(ProfileScreen(self.run_id))

    def action_request_profile(self) -> None:
        """Ask the live run to profile its next steps, in a worker thread (the daemon checks
        that this user may; its answer becomes a notification)."""
        self.notify(f"asking run {self.run_id} to profile its next {PROFILE_STEPS} steps…")
        self.run_worker(self._request_profile, thread=True, group="profile-request", exit_on_error=False)

    def _request_profile(self) -> None:
        from gpuwatch.base import config, paths
        from gpuwatch.client import profile_request
        from gpuwatch.client.link import RequestError
        from gpuwatch.store import StoreError

        try:
            cfg = config.load()
            # the run is looked up where we read it
            db_path = getattr(self.app.source, "db_path", None) or str(paths.reader_db_path(cfg.db))
            text = profile_request.ask(cfg, db_path, self.run_id, PROFILE_STEPS).line
        except (config.ConfigError, StoreError, RequestError) as e:
            self.app.call_from_thread(self.notify, str(e), severity="error", timeout=8)
            return
        self.app.call_from_thread(self.notify, text + "; p shows it when it lands", timeout=8)

    def action_range(self, key: str) -> None:
        self.range_key = key
        self.app.poll_now()

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        self.set_status(*panels.status_line(snap))
        detail = snap.detail
        if detail is None:
            self.query_one("#run-summary", Static).update(
                Text(f"run {self.run_id} not found", style="bold red")
            )
            return
        self.query_one("#run-summary", Static).update(summary(detail, snap.now_ms))
        slow = self.query_one("#run-slowdowns", Static)
        slow.display = bool(detail.slowdowns)  # none: no lines taken
        slow.update(slowdowns_panel(detail))
        stacks = self.query_one("#run-stacks", Static)
        stacks.display = bool(detail.stacks or detail.profiles)  # nothing to say: no lines taken
        stacks.update(stacks_panel(detail))
        self.query_one("#run-charts-title", Static).update(
            Text(f"Range: {RANGES[self.range_key][1]} (keys 1 2 3 0)", style="bold")
        )
        self._show_charts(detail, snap.now_ms)
        self.query_one("#run-config", Static).update(config_table(detail))

    def _show_charts(self, detail: RunDetail, now_ms: int) -> None:
        until = detail.run.ended_ms or now_ms
        views = list(self.query(ChartView))
        if len(views) == len(detail.charts):
            for view, chart in zip(views, detail.charts):
                view.set_chart(chart, until)
        else:
            for view in views:
                view.remove()
            self.query_one("#run-body", VerticalScroll).mount_all(
                [ChartView(c, until) for c in detail.charts], before="#run-config"
            )


def summary(d: RunDetail, now_ms: int) -> Table:
    r = d.run
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    t.add_row("run", Text(f"{r.name or '-'}  ({r.run_id})"))
    t.add_row("status", panels.status_text(r.status) + Text(f"  {d.end_state}" if d.end_state else ""))
    t.add_row("who/where", Text(f"{r.user or '-'} · pid {d.pid or '-'} on {d.host or '-'}"))
    t.add_row(
        "started", f"{fmt.local_time(r.started_ms)} · ran {fmt.duration(panels.run_duration_ms(r, now_ms))}"
    )
    t.add_row(
        "tokens/s",
        f"now {fmt.count(r.tokens_per_s_last)} · avg {fmt.count(r.tokens_per_s_avg)}"
        f" · peak mem {fmt.size(r.peak_mem_bytes)}",
    )
    if d.energy_j is not None:
        t.add_row(
            "energy",
            f"{'' if d.energy_complete else '≥ '}{fmt.kwh(d.energy_j)}"
            f" · {fmt.joules_per_token(d.joules_per_token)}",
        )
    if r.world_size:
        ranks = ", ".join(f"{x.rank}:{x.status}" for x in d.ranks) or "-"
        t.add_row("ranks", Text(f"rank {r.rank} of {r.world_size} (job {d.job_id or '-'}) · {ranks}"))
    if d.command:
        t.add_row("command", Text(d.command, overflow="ellipsis", no_wrap=True))
    return t


def slowdowns_panel(d: RunDetail) -> Text:
    """Each slow phase (shaded on the step-time and tokens/s charts) and its ranked causes."""
    text = Text("slowdowns (shaded on the charts; gpuwatch why RUN for the evidence)", style="bold")
    for s in d.slowdowns:
        text += Text(
            f"\nsteps {s.first_step:,}-{s.last_step:,}  {fmt.local_time(s.start_ms)} "
            f"+{fmt.duration(s.end_ms - s.start_ms)}  {s.slower_pct:.0f} % slower per {s.unit}",
            style="yellow",
        )
        for cause in s.causes:
            text += Text("\n  " + cause, overflow="ellipsis", no_wrap=True)  # users' text: never markup
    return text


def stacks_panel(d: RunDetail) -> Text:
    """The newest stack dump (a stall's, or asked for), one line per thread; profiles count."""
    text = Text(
        f"profiles: {d.profiles} (p: newest, P: profile now)"
        if d.profiles
        else "profiles: none (P: profile now)",
        style="dim",
    )
    s = d.stacks
    if s is None:
        return text
    text += Text("\n") + Text(
        f"stacks ({s.reason.replace('_', ' ')}, pid {s.pid}, {fmt.local_time(s.ts_ms)})",
        style="bold yellow" if s.reason == "stall" else "bold",
    )
    if s.error:
        return text + Text(f"\n{s.error}", style="red")
    for line in s.text.splitlines():
        text += Text("\n" + line, overflow="ellipsis", no_wrap=True)
    return text


def config_table(d: RunDetail) -> Table | Text:
    if not d.config:
        return Text("config: none recorded", style="dim")
    t = Table(title="config", title_justify="left", box=None, show_header=False, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    for k, v in d.config:
        t.add_row(Text(k), Text(v))  # the user's own text: never read as markup
    return t

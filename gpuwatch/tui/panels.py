"""Pure render functions: snapshot pieces in, rich renderables out (dolphie's create_panel habit).

They never query anything; widths decide how much fits (80 columns keeps the essentials).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from gpuwatch import fmt
from gpuwatch.tui.snapshot import GpuRow, HostRow, RunRow, Snapshot

NARROW = 100  # below this many columns, drop the less essential columns


def bar(fraction: float | None, width: int) -> Text:
    """A horizontal meter: green, yellow above 70 %, red above 90 %."""
    if fraction is None:
        return Text("·" * width, style="dim")
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    style = "red" if fraction > 0.9 else "yellow" if fraction > 0.7 else "green"
    return Text("█" * filled, style=style) + Text("░" * (width - filled), style="dim")


def _ratio(used: float | None, total: float | None) -> float | None:
    return used / total if used is not None and total else None


def gpu_table(gpus: tuple[GpuRow, ...], width: int) -> Table:
    narrow = width < NARROW
    table = Table(box=None, pad_edge=False, expand=True, show_edge=False, padding=(0, 1))
    table.add_column("GPU", justify="right", no_wrap=True)
    if not narrow:
        table.add_column("NAME", no_wrap=True, max_width=22, overflow="ellipsis")
    table.add_column("UTIL", no_wrap=True)
    table.add_column("LAST MINUTES", no_wrap=True)
    table.add_column("MEMORY", no_wrap=True)
    table.add_column("TEMP", justify="right", no_wrap=True)
    table.add_column("POWER", justify="right", no_wrap=True)
    table.add_column("STATE", no_wrap=True, overflow="ellipsis", ratio=1)
    bar_w, spark_w = (6, 10) if narrow else (10, 20)
    for g in gpus:
        problems = g.problems()
        state = Text(", ".join(problems), style="bold red") if problems else Text("ok", style="green")
        if g.state == "lost":
            cells = [Text("-", style="dim")] * 5
        else:
            util = bar(None if g.util_pct is None else g.util_pct / 100, bar_w)
            util.append(f" {g.util_pct:>3.0f}%" if g.util_pct is not None else "    -")
            spark = Text(fmt.sparkline(g.util_history, width=spark_w, lo=0, hi=100).rjust(spark_w),
                         style="cyan")
            mem = bar(_ratio(g.mem_used_bytes, g.mem_total_bytes), bar_w)
            mem.append(f" {fmt.size(g.mem_used_bytes)}/{fmt.size(g.mem_total_bytes)}"
                       if not narrow else f" {fmt.size(g.mem_used_bytes)}")
            temp = f"{g.temp_c}°C" if g.temp_c is not None else "-"
            power = (f"{_watts(g.power_mw)}/{_watts(g.power_limit_mw)}" if not narrow
                     else _watts(g.power_mw))
            cells = [util, spark, mem, temp, power]
        row = [str(g.index)] + ([g.name] if not narrow else []) + cells + [state]
        table.add_row(*row)
    return table


def _watts(mw: int | None) -> str:
    return "-" if mw is None else f"{mw / 1000:.0f}W"


def host_line(host: HostRow | None, width: int) -> Text:
    if host is None:
        return Text("host: no samples", style="dim")
    meter = 8 if width < NARROW else 16
    line = Text("CPU ", style="bold")
    line.append_text(bar(None if host.cpu_pct is None else host.cpu_pct / 100, meter))
    line.append(f" {host.cpu_pct:.0f}%  " if host.cpu_pct is not None else " -  ")
    line.append("RAM ", style="bold")
    line.append_text(bar(_ratio(host.mem_used_bytes, host.mem_total_bytes), meter))
    line.append(f" {fmt.size(host.mem_used_bytes)}/{fmt.size(host.mem_total_bytes)}  ")
    line.append("/dev/shm ", style="bold")
    line.append(f"{fmt.size(host.shm_used_bytes)}/{fmt.size(host.shm_total_bytes)}")
    if host.load1 is not None and width >= NARROW:
        line.append(f"  load {host.load1:.2f}")
    return line


def status_line(snap: Snapshot) -> Text:
    """The top line: data age or why there is no data, in plain words."""
    trouble = snap.staleness()
    if trouble:
        return Text(f"⚠ {trouble}", style="bold yellow")
    return Text(f"live · updated {fmt.local_time(snap.data_ms, with_date=False)}", style="dim")


STATUS_STYLES = {"running": "green", "finished": "blue", "failed": "red", "oom": "bold red",
                 "killed": "yellow", "lost": "magenta"}


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def run_duration_ms(run: RunRow, now_ms: int) -> int:
    return (run.ended_ms or now_ms) - run.started_ms

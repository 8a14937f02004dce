"""Pure render functions: snapshot pieces in, rich renderables out (dolphie's create_panel habit).

They never query anything; widths decide how much fits (80 columns keeps the essentials).
"""

from __future__ import annotations

from rich.text import Text

from gpuwatch import fmt
from gpuwatch.tui.snapshot import GpuRow, HostRow, MigRow, RunRow, Snapshot

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


def _widths(width: int) -> tuple[bool, int, int, int, int, int]:
    """(narrow, bar, sparkline, name, memory, power) column widths of the GPU lines."""
    narrow = width < NARROW
    return (narrow, *((6, 10, 0, 10, 5) if narrow else (10, 20, 22, 21, 11)))


def gpu_lines(gpus: tuple[GpuRow, ...], width: int) -> list[Text]:
    """A header and one line per GPU. Plain Text lines, one per widget, so a GPU whose figures
    did not change is not repainted, and few style runs keep each repaint small over SSH."""
    narrow, bar_w, spark_w, name_w, mem_w, power_w = _widths(width)
    head = f"{'GPU':>3} " + (f"{'NAME':<{name_w}} " if name_w else "")
    head += f"{'UTIL':<{bar_w + 5}} {'LAST 5 MIN':<{spark_w}} {'MEMORY':<{bar_w + mem_w}} {'TEMP':>5} {'POWER':>{power_w}} STATE"
    lines = [Text(head, style="bold")]
    for g in gpus:
        line = Text(f"{g.index:>3} ")
        if name_w:
            line.append(f"{g.name[:name_w]:<{name_w}} ")
        if g.state == "lost":
            line.append(" " * (bar_w + 5 + spark_w + bar_w + mem_w + power_w + 9))
        else:
            line.append_text(bar(None if g.util_pct is None else g.util_pct / 100, bar_w))
            line.append(f" {g.util_pct:>3.0f}% " if g.util_pct is not None else "   -  ")
            line.append(fmt.sparkline(g.util_history, width=spark_w, lo=0, hi=100).rjust(spark_w),
                        style="cyan")
            line.append(" ")
            line.append_text(bar(_ratio(g.mem_used_bytes, g.mem_total_bytes), bar_w))
            used = (fmt.size(g.mem_used_bytes) if narrow
                    else f"{fmt.size(g.mem_used_bytes)}/{fmt.size(g.mem_total_bytes)}")
            line.append(f" {used:<{mem_w - 1}}")
            temp = f"{g.temp_c}°C" if g.temp_c is not None else "-"
            power = _watts(g.power_mw) if narrow else f"{_watts(g.power_mw)}/{_watts(g.power_limit_mw)}"
            line.append(f" {temp:>5} {power:>{power_w}} ")
        problems = g.problems()
        if problems:
            line.append(", ".join(problems), style="bold red")
        else:
            line.append("ok", style="green")
        line.truncate(width, overflow="ellipsis")
        lines.append(line)
        if g.state != "lost":
            lines.extend(mig_line(g.index, m, width) for m in g.migs)
    return lines


def mig_line(gpu_index: int, m: MigRow, width: int) -> Text:
    """A MIG device under its GPU: GPU/GI/CI, profile and utilisation ("n/a" when NVML gives
    none) where the GPU's name and utilisation go, its memory in the memory column, and how
    many processes run on it in the state column."""
    narrow, bar_w, spark_w, name_w, mem_w, power_w = _widths(width)
    memory_at = 4 + (name_w + 1 if name_w else 0) + bar_w + 6 + spark_w + 1
    util = "util " + ("n/a" if m.util_pct is None else f"{m.util_pct:.0f}%")
    label = f"  └ {fmt.gpu_label(gpu_index, m.gpu_instance_id, m.compute_instance_id)} {m.profile or 'MIG'}"
    line = Text(f"{label[:memory_at - len(util) - 2]} {util}".ljust(memory_at))
    line.append_text(bar(_ratio(m.mem_used_bytes, m.mem_total_bytes), bar_w))
    used = (fmt.size(m.mem_used_bytes) if narrow
            else f"{fmt.size(m.mem_used_bytes)}/{fmt.size(m.mem_total_bytes)}")
    line.append(f" {used:<{mem_w - 1}}" + " " * (power_w + 8))
    line.append(f"{m.processes} proc{'' if m.processes == 1 else 's'}", style="dim")
    line.truncate(width, overflow="ellipsis")
    return line


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

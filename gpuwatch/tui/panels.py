"""Pure render functions: snapshot pieces in, rich renderables out (dolphie's create_panel habit).

They never query anything; widths decide how much fits (80 columns keeps the essentials).
"""

from __future__ import annotations

from rich.text import Text

from gpuwatch.base import fmt
from gpuwatch.base.clock import run_duration_ms as _run_duration_ms
from gpuwatch.tui.snapshot import GpuRow, HostRow, MigRow, RunRow, Snapshot

NARROW = 100  # below this many columns, drop the less essential columns
WIDE = 140  # from this many columns, all GPM figures (tensor, DRAM, occupancy beside SM activity)


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


# GPM figures beside utilisation, as many as the width allows: (header, GpuRow attribute).
PROF_COLUMNS = (
    ("SM", "sm_active_pct"),
    ("TENS", "tensor_active_pct"),
    ("DRAM", "dram_active_pct"),
    ("OCC", "sm_occupancy_pct"),
)
PROF_W = 5  # " 72% " / " n/a "


def prof_columns(width: int) -> tuple[tuple[str, str], ...]:
    """SM activity; from WIDE columns, tensor-core and DRAM activity and SM occupancy too."""
    return PROF_COLUMNS[: 1 if width < WIDE else 4]


def gpu_widths(width: int) -> tuple[int, ...]:
    """Widths of a GPU line's cells (the state's cell takes the rest): index and name, utilisation
    bar, utilisation, GPM figures, sparkline, memory bar, memory, temperature, power."""
    narrow = width < NARROW
    # At 80 columns the bars and the sparkline give up a little room for the GPM figure.
    bar_w, spark_w, name_w = (5, 8, 0) if narrow else (10, 20, 22)
    return (
        4 + (name_w + 1 if name_w else 0),
        bar_w,
        5,
        PROF_W * len(prof_columns(width)),
        spark_w + 1,
        bar_w,
        10 if narrow else 21,
        6,
        7 if narrow else 13,
    )


def gpu_header(width: int) -> Text:
    head_w, bar_w, pct_w, prof_w, spark_w, mem_bar_w, mem_w, temp_w, power_w = gpu_widths(width)
    head = f"{'GPU':>3} " + (f"{'NAME':<{head_w - 5}} " if head_w > 4 else "")
    prof = "".join(f"{name:>{PROF_W - 1}} " for name, _ in prof_columns(width))
    head += (
        f"{'UTIL':<{bar_w + pct_w}}{prof}{'LAST 5 MIN':<{spark_w - 1}} "
        f"{'MEMORY':<{mem_bar_w + mem_w}}{'TEMP':>{temp_w}}{'POWER':>{power_w - 1}} STATE"
    )
    return Text(head, style="bold")


def prof_cell(g: GpuRow, width: int) -> Text:
    """GPM figures (Hopper and later: SM, tensor-core, DRAM activity); "n/a" where the GPU has none."""
    cell = Text()
    for _, attr in prof_columns(width):
        value = getattr(g, attr)
        if value is None:
            cell.append(" n/a ", style="dim")
        else:
            cell.append(f"{value:>3.0f}% ")
    return cell


def gpu_cells(g: GpuRow, width: int) -> list[Text]:
    """One GPU's line as cells of gpu_widths(width), then its state. Each column of cells is its
    own widget on screen, so a new utilisation repaints (and sends over SSH) that figure alone,
    not the line from its left edge; few style runs keep each repaint small."""
    head_w, bar_w, pct_w, prof_w, spark_w, mem_bar_w, mem_w, temp_w, power_w = gpu_widths(width)
    narrow = width < NARROW
    cells = [Text(f"{g.index:>3} " + (f"{g.name[: head_w - 5]:<{head_w - 5}} " if head_w > 4 else ""))]
    if g.state != "ok":  # lost or not responding: no values
        cells += [Text(" " * w) for w in (bar_w, pct_w, prof_w, spark_w, mem_bar_w, mem_w, temp_w, power_w)]
    else:
        used = (
            fmt.size(g.mem_used_bytes)
            if narrow
            else f"{fmt.size(g.mem_used_bytes)}/{fmt.size(g.mem_total_bytes)}"
        )
        temp = f"{g.temp_c}°C" if g.temp_c is not None else "-"
        power = _watts(g.power_mw) if narrow else f"{_watts(g.power_mw)}/{_watts(g.power_limit_mw)}"
        columns = spark_columns(g.util_history, g.util_history_slot, spark_w - 1)
        cells += [
            bar(None if g.util_pct is None else g.util_pct / 100, bar_w),
            Text(f" {g.util_pct:>3.0f}%" if g.util_pct is not None else "   - "),
            prof_cell(g, width),
            Text(fmt.sparkline(columns, lo=0, hi=100).rjust(spark_w - 1) + " ", style="cyan"),
            bar(_ratio(g.mem_used_bytes, g.mem_total_bytes), mem_bar_w),
            Text(f" {used:<{mem_w - 1}}"),
            Text(f" {temp:>{temp_w - 1}}"),
            Text(f" {power:>{power_w - 2}} "),
        ]
    problems = g.problems()
    cells.append(Text(", ".join(problems), style="bold red") if problems else Text("ok", style="green"))
    # Colours as spans, not as a text's base style: Textual maps only the former to its theme.
    return [Text().append_text(cell) for cell in cells]


def spark_columns(history: tuple[float | None, ...], first_slot: int, width: int) -> list[float | None]:
    """The newest `width` columns of a slot history, each the mean of its slots. Columns are
    aligned to the clock (slot number // slots per column), not to the window's start: the
    line shifts only when a new column is due, and in between only the newest column changes."""
    per = max(1, -(-len(history) // width))
    groups: dict[int, list[float]] = {}
    for k, value in enumerate(history):
        group = groups.setdefault((first_slot + k) // per, [])
        if value is not None:
            group.append(value)
    return [sum(g) / len(g) if g else None for _, g in sorted(groups.items())][-width:]


def mig_line(gpu_index: int, m: MigRow, width: int) -> Text:
    """A MIG device under its GPU: GPU/GI/CI, profile and utilisation ("n/a" when NVML gives
    none) where the GPU's name and utilisation go, its memory in the memory column, and how
    many processes run on it in the state column."""
    head_w, bar_w, pct_w, prof_w, spark_w, mem_bar_w, mem_w, temp_w, power_w = gpu_widths(width)
    narrow = width < NARROW
    memory_at = head_w + bar_w + pct_w + prof_w + spark_w
    util = "util " + ("n/a" if m.util_pct is None else f"{m.util_pct:.0f}%")
    label = f"  └ {fmt.gpu_label(gpu_index, m.gpu_instance_id, m.compute_instance_id)} {m.profile or 'MIG'}"
    line = Text(f"{label[: memory_at - len(util) - 2]} {util}".ljust(memory_at))
    line.append_text(bar(_ratio(m.mem_used_bytes, m.mem_total_bytes), mem_bar_w))
    used = (
        fmt.size(m.mem_used_bytes)
        if narrow
        else f"{fmt.size(m.mem_used_bytes)}/{fmt.size(m.mem_total_bytes)}"
    )
    line.append(f" {used:<{mem_w - 1}}" + " " * (temp_w + power_w))
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


def status_line(snap: Snapshot) -> tuple[Text, Text | None]:
    """The top line as (words, clock): data age or why there is no data, in plain words."""
    trouble = snap.staleness()
    if snap.spooled:
        trouble = f"{trouble} · {snap.spooled}" if trouble else snap.spooled
    if trouble:
        return Text(f"⚠ {trouble}", style="bold yellow"), None
    clock = Text(fmt.local_time(snap.data_ms, with_date=False), style="dim")
    if snap.alert_line:  # the clock first: the alert's title is cut at the screen's edge
        return Text("updated ", style="dim"), clock + Text(f" · ⚠ {snap.alert_line}", style="bold red")
    if snap.notice:
        return Text(f"{snap.notice} ", style="yellow"), clock  # at 80 columns: no room for "updated"
    return Text("live · updated ", style="dim"), clock


STATUS_STYLES = {
    "running": "green",
    "finished": "blue",
    "failed": "red",
    "oom": "bold red",
    "killed": "yellow",
    "lost": "magenta",
}


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(status, ""))


def run_duration_ms(run: RunRow, now_ms: int) -> int:
    return _run_duration_ms(run.started_ms, run.ended_ms, now_ms)

"""A small braille line chart with a labelled y-axis and a time x-axis, as a rich Text.

Pure function of (chart, size): the widget that shows it just calls `render_chart` again
when its size or its snapshot changes. Each terminal cell holds 2x4 braille dots.
"""

from __future__ import annotations

from typing import Callable

from rich.text import Text

from gpuwatch.base import fmt
from gpuwatch.tui.snapshot import Chart

COLOURS = ("green", "cyan", "magenta", "yellow")
SHADE = "grey30"  # background of a shaded span (a slow phase)
_DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][col] in a cell


def axis_value(value: float, unit: str) -> str:
    if unit == "bytes":
        return fmt.size(value)
    if unit == "pct":
        return f"{value:.0f}%"
    if unit == "ms":
        return fmt.duration(value)
    if unit == "loss":
        return f"{value:.3g}"
    return fmt.count(round(value, 1))


def render_chart(
    chart: Chart, width: int, height: int, until_ms: int, x_format: Callable[[float], str] | None = None
) -> Text:
    """Draw every series of `chart` into width x height cells (axis and legend included).

    x is time ending at until_ms (the axis says how long before "now"), or with `x_format` any
    quantity up to until_ms (e.g. tokens seen), its ends labelled with x_format."""
    out = Text()
    legend = Text(chart.title + "  ", style="bold")
    for i, s in enumerate(chart.series):
        last = s.points[-1][1] if s.points else None
        legend.append(f"● {s.label} ", style=COLOURS[i % len(COLOURS)])
        legend.append(f"{axis_value(last, s.unit) if last is not None else '-'}  ")
    out.append_text(legend)
    out.append("\n")
    points = [p for s in chart.series for p in s.points]
    plot_h = max(1, height - 2)  # legend line and x-axis line
    if not points:
        out.append("(no data in this range)", style="dim")
        return out
    unit = chart.series[0].unit
    # Sizes and percentages start at zero (how full); rates and times zoom in on their range.
    lowest = min(v for _, v in points)
    lo = min(0.0, lowest) if unit in ("bytes", "pct") else lowest
    hi = max(v for _, v in points)
    if hi - lo < 1e-9:  # a flat line: give it some room so the axis labels differ
        pad = max(abs(hi) * 0.05, 1.0)
        lo, hi = (lo if unit in ("bytes", "pct") else lo - pad), hi + pad
    labels = [axis_value(hi, unit), axis_value((hi + lo) / 2, unit), axis_value(lo, unit)]
    label_w = max(len(s) for s in labels)
    plot_w = max(4, width - label_w - 2)
    t0 = min(t for t, _ in points)
    t1 = max(until_ms, t0 + 1)
    cells = [[0] * plot_w for _ in range(plot_h)]
    owner = [[-1] * plot_w for _ in range(plot_h)]
    for si, s in enumerate(chart.series):
        dots = [
            (int((t - t0) / (t1 - t0) * (plot_w * 2 - 1)), int((hi - v) / (hi - lo) * (plot_h * 4 - 1)))
            for t, v in s.points
        ]
        for (x0, y0), (x1, y1) in zip(dots, dots[1:] or dots):
            steps = max(abs(x1 - x0), abs(y1 - y0), 1)  # join neighbours with a straight line
            for k in range(steps + 1):
                x = min(plot_w * 2 - 1, x0 + (x1 - x0) * k // steps)
                y = min(plot_h * 4 - 1, y0 + (y1 - y0) * k // steps)
                row, col = y // 4, x // 2
                cells[row][col] |= _DOT_BITS[y % 4][x % 2]
                if owner[row][col] < 0:
                    owner[row][col] = si
    # Shaded columns: those whose middle falls in a span of chart.shaded (a run's slow phases).
    shade = [
        any(a <= t0 + (col + 0.5) / plot_w * (t1 - t0) <= b for a, b in chart.shaded) for col in range(plot_w)
    ]
    for row in range(plot_h):
        if row == 0:
            label = labels[0]
        elif row == plot_h - 1:
            label = labels[2]
        elif row == plot_h // 2:
            label = labels[1]
        else:
            label = ""
        out.append(f"{label:>{label_w}} ┤" if label else " " * label_w + " │", style="dim")
        for col in range(plot_w):
            bits = cells[row][col]
            back = f" on {SHADE}" if shade[col] else ""
            if bits:
                out.append(chr(0x2800 + bits), style=COLOURS[owner[row][col] % len(COLOURS)] + back)
            else:
                out.append(" ", style=back.strip() or None)
        out.append("\n")
    start, end = ("-" + fmt.duration(t1 - t0), "now") if x_format is None else (x_format(t0), x_format(t1))
    axis = " " * (label_w + 1) + "└" + start.ljust(plot_w - len(end), "─") + end
    out.append(axis, style="dim")
    return out

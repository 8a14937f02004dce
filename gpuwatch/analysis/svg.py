"""Small inline SVG line charts for self-contained HTML reports (no JavaScript, no fonts to fetch)."""

from __future__ import annotations

from html import escape
from typing import Callable, Sequence

from gpuwatch.base import fmt

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
MAX_POINTS = 600  # per series; longer series are averaged into buckets
Series = tuple[str, Sequence[tuple[float, float]]]


def _downsample(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    n = len(points)
    if n <= MAX_POINTS:
        return list(points)
    out = []
    for b in range(MAX_POINTS):
        chunk = points[b * n // MAX_POINTS : (b + 1) * n // MAX_POINTS]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out


def line_chart(
    title: str,
    series: Sequence[Series],
    x_range: tuple[float, float],
    y_fmt: Callable[[float], str],
    y_min: float | None = 0.0,
    y_max: float | None = None,
    width: int = 760,
    height: int = 240,
    x_fmt: Callable[[float], str] | None = None,
) -> str:
    """An <svg> of one line per series over x_range (epoch ms, shown as time since its start;
    or any quantity shown with x_fmt), y shown with y_fmt. Charts of one run share x_range so
    they line up."""
    left, right, top, bottom = 80, 16, 28, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    series = [(label, _downsample(points)) for label, points in series if points]
    head = (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img"><title>{escape(title)}</title>'
        f'<text x="{left}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>'
    )
    if not series:
        return head + (
            f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#888">'
            "no data recorded</text></svg>"
        )
    xs = [x for _, pts in series for x, _ in pts]
    ys = [y for _, pts in series for _, y in pts]
    x_lo, x_hi = min(x_range[0], min(xs)), max(x_range[1], max(xs))
    y_lo = min(ys) if y_min is None else min(y_min, min(ys))
    y_hi = max(ys) if y_max is None else max(y_max, max(ys))
    if y_hi == y_lo:
        y_hi = y_lo + (abs(y_lo) or 1)
    x_span = (x_hi - x_lo) or 1

    def px(x: float) -> float:
        return left + (x - x_lo) / x_span * plot_w

    def py(y: float) -> float:
        return top + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h

    parts = [
        head,
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
    ]
    for i in range(5):
        y = y_lo + (y_hi - y_lo) * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{py(y) + 4:.1f}" font-size="11" text-anchor="end">'
            f"{escape(y_fmt(y))}</text>"
        )
        x = x_lo + x_span * i / 4
        anchor = ("start", "middle", "middle", "middle", "end")[i]  # keep the end labels inside
        parts.append(
            f'<text x="{px(x):.1f}" y="{height - 6}" font-size="11" text-anchor="{anchor}">'
            f"{escape(fmt.duration(x - x_lo) if x_fmt is None else x_fmt(x))}</text>"
        )
    legend_x = left + 9 * len(title) + 24  # legend on the title line, after the title
    for n, (label, pts) in enumerate(series):
        colour = PALETTE[n % len(PALETTE)]
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}">'
            f"<title>{escape(label)}</title></polyline>"
        )
        parts.append(f'<text x="{legend_x}" y="18" font-size="11" fill="{colour}">■ {escape(label)}</text>')
        legend_x += 7 * len(label) + 24
    parts.append("</svg>")
    return "".join(parts)

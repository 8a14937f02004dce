"""Braille charts in a terminal command's output, drawn by the TUI's chart renderer."""

from __future__ import annotations

import io
from typing import Sequence

from gpuwatch.base import fmt

WIDTH, HEIGHT = 72, 9


def loss_chart(
    curves: Sequence[tuple[str, Sequence[tuple[int, float]]]],
    unit: str,
    colour: bool,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Loss against tokens (or steps) seen, a line per (label, points); colours only if `colour`."""
    from rich.console import Console

    from gpuwatch.tui.chart import render_chart
    from gpuwatch.tui.snapshot import Chart, Series

    series = tuple(Series(label, "loss", tuple(points)) for label, points in curves)
    until = max((p[-1][0] for _, p in curves if p), default=1)
    text = render_chart(
        Chart(f"loss vs {unit}", series),
        width,
        height,
        until,
        x_format=lambda x: f"{fmt.count(x)} {unit}" if x >= until else fmt.count(x),
    )
    out = io.StringIO()
    Console(
        file=out,
        width=width,
        force_terminal=colour,
        color_system="standard" if colour else None,
        highlight=False,
    ).print(text, soft_wrap=True)
    return "\n".join(line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())

"""One self-contained HTML file about a run: summary, charts (inline SVG), slowdowns and their causes,
config, OOM postmortem.

Everything that came from a user or a workload (names, commands, config, errors) is escaped.
"""

from __future__ import annotations

import json
import sqlite3
from html import escape

from gpuwatch.analysis import svg
from gpuwatch.analysis.compare import ROWS, run_stats
from gpuwatch.analysis.loss import loss_curve
from gpuwatch.analysis.rundata import run_window
from gpuwatch.base import fmt
from gpuwatch.store import now_ms, queries

CHART_POINTS = 300
_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:62em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .6em;text-align:left}
th{background:#f4f4f4}pre{background:#f6f6f6;padding:.8em;overflow:auto}.oom{border-left:4px solid #d62728;padding-left:1em}
"""


def _table(rows, header=None) -> str:
    head = "<tr>" + "".join(f"<th>{escape(str(h))}</th>" for h in header) + "</tr>" if header else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(fmt.MISSING if c is None else str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table>{head}{body}</table>"


def _charts(conn: sqlite3.Connection, run, stats, start: int, end: int) -> list[str]:
    steps = conn.execute(
        "SELECT ts_ms, tokens_per_s, mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes "
        "FROM steps WHERE run_id = ? ORDER BY step",
        (run.run_id,),
    ).fetchall()
    col = lambda i: [(r[0], r[i]) for r in steps if r[i] is not None]  # noqa: E731
    charts = [
        svg.line_chart("Tokens per second", [("tokens/s", col(1))], (start, end), fmt.count),
        svg.line_chart(
            "CUDA memory",
            [("allocated", col(2)), ("reserved", col(3)), ("peak", col(4))],
            (start, end),
            fmt.size,
        ),
    ]
    for title, metric, scale, y_fmt, y_max in (
        ("GPU utilisation", "gpu_util_pct", 1, lambda v: f"{v:.0f} %", 100),
        ("GPU power", "power_mw", 1 / 1000, lambda v: f"{v:.0f} W", None),
    ):
        series = []
        for idx in stats.gpus:
            points = queries.gpu_series(conn, idx, metric, start, end + 1, max_points=CHART_POINTS)
            series.append((f"GPU {idx}", [(p.ts_ms, p.avg * scale) for p in points if p.avg is not None]))
        charts.append(svg.line_chart(title, series, (start, end), y_fmt, y_max=y_max))
    curve = loss_curve(conn, run.run_id)
    if curve.by_steps:
        charts.append(_loss_chart(curve))
    return charts


def _loss_chart(curve) -> str:
    """Loss against tokens seen (steps when tokens are missing)."""
    points = curve.axis(curve.tokens_known)
    unit = "tokens" if curve.tokens_known else "steps"
    span = (points[0][0], points[-1][0])
    return svg.line_chart(
        f"Loss vs {unit}",
        [("loss", points)],
        span,
        lambda v: f"{v:.3g}",
        y_min=None,
        x_fmt=lambda x: f"{fmt.count(round(x))} {unit}",
    )


def _oom_section(conn: sqlite3.Connection, run_id: str) -> str:
    cur = conn.execute("SELECT * FROM oom_postmortems WHERE run_id = ? ORDER BY ts_ms", (run_id,))
    cols = [d[0] for d in cur.description]
    parts = []
    for row in (dict(zip(cols, r)) for r in cur.fetchall()):
        device = "host" if row["kind"] == "host" else f"GPU {row['device']}"
        facts = [
            ("when", fmt.local_time(row["ts_ms"])),
            ("where", device),
            ("phase", row["phase"]),
            ("step", row["step"]),
            ("seq_len", row["seq_len"]),
            ("batch", row["batch"]),
            ("requested", fmt.size(row["requested_bytes"])),
            ("free", fmt.size(row["free_bytes"])),
            ("total", fmt.size(row["total_bytes"])),
            ("allocated", fmt.size(row["allocated_bytes"])),
            ("reserved", fmt.size(row["reserved_bytes"])),
            ("host RSS", fmt.size(row["rss_bytes"])),
            ("host available", fmt.size(row["available_bytes"])),
        ]
        html = [
            f'<div class="oom"><h3>Out of memory on {escape(device)}</h3>',
            _table([(k, v) for k, v in facts if v not in (None, fmt.MISSING)]),
        ]
        if row["error_message"]:
            html.append(f"<pre>{escape(row['error_message'])}</pre>")
        advice = _json_list(row["advice_json"])
        if advice:
            html.append(
                "<h4>Advice</h4><ul>"
                + "".join(
                    f"<li><b>{escape(str(a.get('title', '')))}</b> {escape(str(a.get('detail', '')))}</li>"
                    for a in advice
                )
                + "</ul>"
            )
        neighbours = _json_list(row["neighbours_json"])
        if neighbours:
            html.append(
                "<h4>Other processes on that GPU</h4>"
                + _table(
                    [
                        (n.get("pid"), n.get("user"), fmt.size(n.get("used_mem_bytes")), n.get("run_id"))
                        for n in neighbours
                    ],
                    ("pid", "user", "GPU memory", "run"),
                )
            )
        if row["traceback"]:
            html.append(
                f"<details><summary>Traceback</summary><pre>{escape(row['traceback'])}</pre></details>"
            )
        html.append("</div>")
        parts.append("".join(html))
    return "<h2>OOM postmortem</h2>" + "".join(parts) if parts else ""


def _slowdowns_section(conn: sqlite3.Connection, run_id: str) -> str:
    """Each slow phase (gpuwatch why) with its ranked causes."""
    from gpuwatch.analysis.why import analyse
    from gpuwatch.analysis.why.render import none_found

    result = analyse(conn, run_id)
    if result.baseline_ms_per_unit is None:
        return ""
    if not result.slowdowns:
        return f"<h2>Slowdowns</h2><p>{escape(none_found(result.unit))}; {result.pauses} pauses between steps.</p>"
    rows = []
    for s in result.slowdowns:
        causes = "; ".join(f"{c.share_pct:.0f} % {c.kind}: {c.detail}" for c in s.causes)
        rows.append(
            (
                f"{s.first_step:,}-{s.last_step:,}",
                fmt.local_time(s.start_ms),
                fmt.duration(s.duration_ms),
                f"{s.slower_pct:.0f} %",
                causes,
            )
        )
    return "<h2>Slowdowns</h2>" + _table(
        rows, ("steps", "from", "for", f"slower per {result.unit}", "causes")
    )


def _json_list(text: str | None) -> list[dict]:
    try:
        value = json.loads(text) if text else []
    except ValueError:
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def render(conn: sqlite3.Connection, ref: str) -> str:
    """The report of one run as an HTML document."""
    run = queries.run(conn, ref)
    stats = run_stats(conn, run.run_id)
    start, end = run_window(conn, run)
    title = f"{run.name or run.run_id} — gpuwatch run report"
    about = [
        ("run id", run.run_id),
        ("name", run.name),
        ("user", run.user),
        ("host", run.host),
        ("status", run.status),
        ("started", fmt.local_time(run.started_ms)),
        ("ended", fmt.local_time(run.ended_ms)),
        ("command", run.command),
        ("cwd", run.cwd),
        ("git commit", run.git_commit),
        ("torch", run.torch_version),
        ("CUDA", run.cuda_version),
        ("rank / world size", None if run.world_size is None else f"{run.rank} / {run.world_size}"),
        ("GPUs", ", ".join(map(str, stats.gpus)) or None),
        ("error", run.error_message),
    ]
    figures = [(row.label, row.text(stats)) for row in ROWS]
    if run.config:
        config = json.dumps(run.config, indent=2, sort_keys=True)
    else:
        config = run.config_json or "(none recorded)"
    return "".join(
        [
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>',
            f"<style>{_STYLE}</style></head><body>",
            f"<h1>{escape(run.name or run.run_id)}</h1>",
            _table([(k, v) for k, v in about if v is not None]),
            "<h2>Figures</h2>",
            _table(figures),
            "<h2>Over the run</h2>",
            *(f"<div>{c}</div>" for c in _charts(conn, run, stats, start, end)),
            _slowdowns_section(conn, run.run_id),
            _oom_section(conn, run.run_id),
            f"<h2>Config</h2><pre>{escape(config)}</pre>",
            f"<p><small>gpuwatch report, generated {escape(fmt.local_time(now_ms()))}</small></p>",
            "</body></html>\n",
        ]
    )

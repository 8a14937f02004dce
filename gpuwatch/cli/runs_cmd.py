"""`gpuwatch runs` (a table of runs) and `gpuwatch show RUN` (one run in detail)."""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING

import click

from gpuwatch.base import fmt
from gpuwatch.base.clock import run_duration_ms
from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path
from gpuwatch.cli.query_cmd import echo_data

if TYPE_CHECKING:
    from gpuwatch.store.queries import RankRun

STATUSES = ("running", "finished", "failed", "oom", "killed", "lost")
_AGO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
SPARK_WIDTH = 60


def parse_since(text: str, now_ms: int) -> int:
    """'90m', '2h', '1d', '1w' ago, or an ISO date/time (local time unless it has an offset)."""
    m = _AGO.match(text)
    if m:
        return now_ms - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    try:
        return int(datetime.fromisoformat(text.strip()).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither a duration like 2h, 1d, 30m nor an ISO time like 2026-01-31T14:00",
            param_hint="--since",
        ) from None


def _start(ts_ms: int, now_ms: int) -> str:
    """'14:05' within the last day, else 'Dec02' (as ps does), so the table fits 80 columns."""
    if now_ms - ts_ms < 86_400_000:
        return time.strftime("%H:%M", time.localtime(ts_ms / 1000))
    return time.strftime("%b%d", time.localtime(ts_ms / 1000))


# (header, width, right-aligned): 8+12+8+8+5+6+6+6+9+3 columns + 9 spaces = 80.
_COLUMNS = (
    ("ID", 8, False),
    ("NAME", 12, False),
    ("USER", 8, False),
    ("STATUS", 8, False),
    ("START", 5, False),
    ("DUR", 6, True),
    ("TOK/S", 6, True),
    ("LAST", 6, True),
    ("PEAK MEM", 9, True),
    ("OOM", 3, False),
)


def runs_table(summaries, now_ms: int, fit: bool = True) -> str:
    """The runs as a table: cut to 80 columns for a terminal, or whole (full ids and names)."""
    rows = []
    for r in summaries:
        rows.append(
            [
                r.run_id[:8] if fit else r.run_id,
                r.name,
                r.user,
                r.status,
                _start(r.started_ms, now_ms),
                fmt.duration(run_duration_ms(r.started_ms, r.ended_ms, now_ms)),
                fmt.count(r.tokens_per_s_avg),
                fmt.count(r.tokens_per_s_last),
                fmt.size(r.peak_mem_bytes),
                "OOM" if r.oom else "",
            ]
        )
    widths = [
        w if fit else max([len(h)] + [len(c or "-") for c in (row[i] for row in rows)])
        for i, (h, w, _) in enumerate(_COLUMNS)
    ]

    def line(cells):
        return " ".join(
            fmt.clip(c, w).rjust(w) if right else fmt.clip(c, w).ljust(w)
            for c, w, (_, _, right) in zip(cells, widths, _COLUMNS)
        ).rstrip()

    return "\n".join([line([h for h, _, _ in _COLUMNS])] + [line(row) for row in rows])


def on_terminal() -> bool:
    """A person reads a terminal (fit the table to it); a pipe or file is read by a script."""
    return sys.stdout.isatty()


# Fields of `gpuwatch runs --format csv|json`: raw values, units in the names.
_DATA_FIELDS = (
    "run_id",
    "name",
    "user",
    "uid",
    "host",
    "pid",
    "status",
    "started_ms",
    "ended_ms",
    "steps",
    "tokens_per_s_avg",
    "tokens_per_s_last",
    "peak_mem_bytes",
    "oom",
    "job_id",
    "rank",
    "world_size",
)


@click.command("runs")
@click.option("--user", help="Only this user's runs.")
@click.option("--status", type=click.Choice(STATUSES), help="Only runs with this status.")
@click.option("--since", help="Runs active since: 2h, 1d, 30m, or an ISO time.")
@click.option(
    "--search",
    metavar="TEXT",
    help="Only runs whose name, command, config, git commit, cwd or notes hold every "
    "word of TEXT (full-text search; a word matches as a prefix): lr=3e-4, a3f9c2.",
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="At most this many runs, newest first.",
)
@click.option(
    "--format",
    "fmt_",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output format; csv and json give raw values for scripts.",
)
@db_option
@friendly_errors
def runs_cmd(user, status, since, search, limit, fmt_, db) -> None:
    """List runs, newest first: status, duration, tokens/s (average and last), peak memory, OOM.

    Example: gpuwatch runs --status oom --since 1d; gpuwatch runs --search "lr=3e-4 gpt"
    """
    from gpuwatch.store import now_ms, open_ro, queries

    now = now_ms()
    since_ms = parse_since(since, now) if since else None
    if search is not None and not search.strip():
        raise click.BadParameter("give at least one word to search for", param_hint="--search")
    conn = open_ro(reader_db_path(db))
    try:
        summaries = queries.runs(
            conn, user=user, status=status, since_ms=since_ms, limit=limit, search=search
        )
    finally:
        conn.close()
    if fmt_ != "table":
        echo_data(list(_DATA_FIELDS), [[getattr(r, f) for f in _DATA_FIELDS] for r in summaries], fmt_)
    elif not summaries:
        click.echo("no runs match" if (user or status or since or search) else "no runs recorded yet")
    else:
        click.echo(runs_table(summaries, now, fit=on_terminal()))


def _signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name
    except (TypeError, ValueError):
        return f"signal {signum}"


def _end_line(run) -> str:
    if run.status == "running":
        return "running"
    if run.status == "killed" and run.signal:
        return f"killed by {_signal_name(run.signal)}"
    text = run.status
    if run.exit_code is not None:
        text += f", exit code {run.exit_code}"
    if run.error_type:
        text += f": {run.error_type}" + (f": {run.error_message}" if run.error_message else "")
    return text


def energy_line(energy, tokens: int | None) -> str:
    """kWh of the run's share of its GPUs, and per token it processed while counted; '≥' when
    the raw samples of the run's start had expired."""
    partial = "" if energy.complete else "≥ "
    text = (
        f"  energy    {partial}{fmt.kwh(energy.joules)} ({fmt.count(energy.joules)} J) on GPU"
        f"{'s' if len(energy.gpus) > 1 else ''} {','.join(map(str, energy.gpus))}   {fmt.joules_per_token(energy.joules / tokens if tokens else None)}"
    )
    if not energy.complete:
        text += f"   (counted from {fmt.local_time(energy.from_ms)}: older samples expired)"
    return text


def loss_lines(run_id: str, steps, colour: bool) -> list[str]:
    """Final and best loss, and the loss against tokens seen (steps when tokens are missing)."""
    from gpuwatch.analysis.loss import curve_of, final_and_best
    from gpuwatch.cli.charts import loss_chart

    curve = curve_of(run_id, ((s.step, s.tokens, s.loss) for s in steps))
    final, best = final_and_best(curve)
    if final is None:
        return []
    unit = "tokens" if curve.tokens_known else "steps"
    from gpuwatch.analysis.step_split import named_losses

    named = named_losses(steps)  # several optimisers: each one's loss (`loss` is the first's)
    each = (
        [
            "  losses    "
            + "   ".join(
                f"{name} final {points[-1][1]:.4g} (best {min(v for _, v in points):.4g})"
                for name, points in named.items()
            )
        ]
        if named
        else []
    )
    return [
        f"  loss      final {final:.4g}   best {best:.4g}",
        *each,
        *(
            "  " + line
            for line in loss_chart(
                [("loss", curve.axis(curve.tokens_known))], unit, colour, width=SPARK_WIDTH + 12
            ).splitlines()
        ),
    ]


def show_text(
    run,
    steps,
    attached: dict,
    ranks: list[RankRun],
    now_ms: int,
    energy=None,
    energy_tokens: int | None = None,
    colour: bool = False,
    notes=(),
    breakdown: dict | None = None,
    not_instrumented: str | None = None,
    slowdowns: list[str] | None = None,
) -> str:
    out = []
    add = out.append
    title = f"run {run.run_id}" + (f"  {run.name}" if run.name else "") + f"  [{run.status}]"
    add(title)
    add(f"  user      {run.user or run.uid} on {run.host or '-'}  pid {run.pid or '-'}  ({run.mode or '-'})")
    add(
        f"  started   {fmt.local_time(run.started_ms)}   ended {fmt.local_time(run.ended_ms)}"
        f"   duration {fmt.duration(run_duration_ms(run.started_ms, run.ended_ms, now_ms))}"
    )
    add(f"  command   {run.command or '-'}")
    add(f"  cwd       {run.cwd or '-'}   git {run.git_commit[:12] if run.git_commit else '-'}")
    torch_version = run.torch_version or attached.get("torch_version")
    cuda_version = run.cuda_version or attached.get("cuda_version")
    add(
        f"  torch     {torch_version or '-'}   CUDA {cuda_version or '-'}"
        f"   GPUs {run.gpu_uuids or attached.get('gpu_uuids') or '-'}"
    )
    if run.world_size or run.job_id or run.slurm_job_id:
        add(
            f"  rank      {'-' if run.rank is None else run.rank}/{run.world_size or '-'}"
            f" (local {'-' if run.local_rank is None else run.local_rank})"
            f"   job {run.job_id or '-'}   slurm {run.slurm_job_id or '-'}"
        )
    add(f"  end       {_end_line(run)}")

    add("")
    if steps:
        rates = [s.tokens_per_s for s in steps]
        known = [r for r in rates if r is not None]
        # A folded row stands for n_steps steps; its step_time_ms is their mean.
        timed = [(s.tokens, s.step_time_ms * s.n_steps) for s in steps if s.tokens and s.step_time_ms]
        avg = sum(t for t, _ in timed) / (sum(ms for _, ms in timed) / 1000.0) if timed else None
        add(
            f"  steps     {sum(s.n_steps for s in steps)}   tokens/s avg {fmt.count(avg)}   last {fmt.count(known[-1] if known else None)}"
            f"   mfu last {fmt.percent(next((s.mfu for s in reversed(steps) if s.mfu is not None), None))}"
        )
        if known:
            add(
                f"  tokens/s  {fmt.sparkline(rates, width=SPARK_WIDTH)}  "
                f"{fmt.count(min(known))}..{fmt.count(max(known))}"
            )
        waits = [s.data_wait_pct for s in steps]
        known_waits = [w for w in waits if w is not None]
        if known_waits:
            add(
                f"  data wait {fmt.sparkline(waits, width=SPARK_WIDTH, lo=0, hi=100)}  "
                f"avg {sum(known_waits) / len(known_waits):.0f}% of each step, "
                f"last {known_waits[-1]:.0f}%  (waiting for the batch before compute)"
            )
        from gpuwatch.analysis.step_split import mean_split

        split = mean_split(steps)
        if split is not None:
            add(
                "  split     "
                + "   ".join(f"{part} {share:.0f}%" for part, share in split.items())
                + "  (mean share of a step)"
            )
        gpu_peak = max((s.mem_peak_bytes for s in steps if s.mem_peak_bytes is not None), default=None)
        reserved = max(
            (s.mem_reserved_bytes for s in steps if s.mem_reserved_bytes is not None), default=None
        )
        rss = max((s.rss_bytes for s in steps if s.rss_bytes is not None), default=None)
        add(
            f"  memory    GPU peak allocated {fmt.size(gpu_peak)}   reserved {fmt.size(reserved)}"
            f"   host RSS peak {fmt.size(rss)}"
        )
        out.extend(loss_lines(run.run_id, steps, colour))
    elif not_instrumented:
        add(f"  steps     none: not instrumented: {not_instrumented}")
    elif any(r.name and run.name and r.name.startswith(f"{run.name}/") for r in ranks):
        add("  steps     none of its own: each process that trained has its run (below)")
    else:
        add("  steps     none recorded (not instrumented, or no step() yet)")
    if energy is not None:
        add(energy_line(energy, energy_tokens))
    if breakdown:
        from gpuwatch.analysis.trace.render import headline

        add(f"  profile   {headline(breakdown)}")

    if slowdowns:
        add("")
        add("slowdowns (gpuwatch why RUN: phases and evidence)")
        out.extend(slowdowns)

    config = run.config or attached.get("config") or {}
    if config:
        add("")
        add("config")
        width = min(max(len(str(k)) for k in config), 24)
        for key, value in config.items():
            add(f"  {str(key).ljust(width)}  {json.dumps(value) if not isinstance(value, str) else value}")
    if ranks:
        add("")
        add("ranks" if all(r.rank is not None for r in ranks) else "processes of this job")
        for r in ranks:
            add(
                f"  {r.run_id}  {r.name or '-'}  rank {'-' if r.rank is None else r.rank}"
                f" (local {'-' if r.local_rank is None else r.local_rank})  {r.status}  {r.host or '-'}"
            )
    if notes:
        add("")
        add("notes")
        for note in notes:
            add(f"  {fmt.local_time(note.ts_ms)}  {note.user or note.uid}: {note.text}")
    return "\n".join(out)


@click.command("show")
@click.argument("run_ref", metavar="RUN")
@db_option
@friendly_errors
def show_cmd(run_ref, db) -> None:
    """Show one run: summary, end state, tokens/s sparkline, memory peaks, energy (kWh, J/token),
    final and best loss with a chart of loss against tokens seen, slowdowns and their causes
    (as `gpuwatch why`), config, ranks, notes.

    RUN is a run id, a unique id prefix, or a run name (the newest run with that name).

    Example: gpuwatch show gpt-4k
    """
    from gpuwatch.analysis.rundata import run_window
    from gpuwatch.analysis.why import analyse
    from gpuwatch.analysis.why.render import slowdown_lines
    from gpuwatch.store import now_ms, open_ro, profiles, queries
    from gpuwatch.store.energy import run_energy

    conn = open_ro(reader_db_path(db))
    colour = sys.stdout.isatty()
    try:
        run = queries.run(conn, run_ref)
        start, end = run_window(conn, run)
        energy = run_energy(conn, {run.run_id: (start, end)}).get(run.run_id)
        tokens = energy and queries.run_tokens(conn, run.run_id, energy.from_ms, end)
        steps = queries.steps(conn, run.run_id)
        slowdowns = slowdown_lines(analyse(conn, run.run_id)) if steps else None
        text = show_text(
            run,
            steps,
            queries.run_event_payload(conn, run.run_id),
            queries.job_ranks(conn, run),
            now_ms(),
            energy=energy,
            energy_tokens=tokens,
            colour=colour,
            notes=queries.notes(conn, run.run_id),
            breakdown=profiles.latest_breakdown(conn, run.run_id),
            not_instrumented=queries.run_event_payload(conn, run.run_id, "not_instrumented").get("reason"),
            slowdowns=slowdowns,
        )
    finally:
        conn.close()
    click.echo(text, color=colour)

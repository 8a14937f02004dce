"""`gpuwatch profile RUN --steps N`: profile a live run's next steps, show its top operators."""

from __future__ import annotations

import click

from gpuwatch.base import fmt
from gpuwatch.cli.options import db_option, friendly_errors, load_config, reader_db_path


def resolve_run(db: str | None):
    """Open the readers' database; (connection, run lookup)."""
    from gpuwatch.store import open_ro, queries

    conn = open_ro(reader_db_path(db))
    return conn, lambda ref: queries.run(conn, ref)


def ops_table(ops, width: int = 80) -> str:
    name_w = width - 50
    lines = [
        f"{'OPERATOR':<{name_w}} {'CALLS':>6} {'SELF CPU':>8} {'CPU TOT':>8} "
        f"{'SELF DEV':>8} {'DEV TOT':>8} {'MEM':>6}"
    ]
    for op in ops:
        name = op.name if len(op.name) <= name_w else op.name[: name_w - 1] + "…"
        lines.append(
            f"{name:<{name_w}} {fmt.count(op.calls):>6} {fmt.duration(us_ms(op.self_cpu_us)):>8} "
            f"{fmt.duration(us_ms(op.cpu_total_us)):>8} {fmt.duration(us_ms(op.self_device_us)):>8} "
            f"{fmt.duration(us_ms(op.device_total_us)):>8} {fmt.size(op.self_mem_bytes):>6}"
        )
    return "\n".join(lines)


def us_ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def breakdown_text(breakdown: dict | None, width: int = 80) -> list[str]:
    """The stored trace analysis, as `gpuwatch trace` prints it: the bar first, then advice."""
    if breakdown is None:
        return []
    from gpuwatch.analysis.trace.render import advice_lines, rank_lines

    # without the rank/file line (the heading says it) and the operators (the table below)
    lines = rank_lines(breakdown, width, operators=False)[1:]
    return (
        lines
        + ["advice:"]
        + (advice_lines(breakdown.get("advice") or [], width) or ["  none: nothing stands out"])
        + [""]
    )


def profile_text(profile, ops, breakdown: dict | None = None) -> str:
    last = (profile.first_step or 0) + (profile.steps or 1) - 1
    head = (
        f"profile {profile.id} of run {profile.run_id} ({profile.trigger}, steps "
        f"{profile.first_step}-{last}{'' if profile.rank is None else f', rank {profile.rank}'}) "
        f"at {fmt.local_time(profile.ts_ms)}"
    )
    if profile.trace_path:
        trace = (
            f"trace: {profile.trace_path} ({fmt.size(profile.trace_bytes)}; open in https://ui.perfetto.dev)"
        )
    elif profile.trace_bytes:
        trace = f"trace dropped: {fmt.size(profile.trace_bytes)} gzipped exceeds profile_max_mb"
    else:
        trace = "no trace file"
    return "\n".join([head, trace, *breakdown_text(breakdown), ops_table(ops)])


@click.command("profile")
@click.argument("run")
@click.option(
    "--steps",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="How many of the run's next steps to profile.",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the profile to land (0: ask and return).",
)
@click.option("--show", is_flag=True, help="Show the newest stored profile; ask for nothing.")
@db_option
@friendly_errors
def profile_cmd(run, steps, wait, show, db) -> None:
    """Profile RUN's next steps with torch.profiler (through the daemon) and show the top
    operators; the Chrome trace (.json.gz) opens in Perfetto.

    Example: gpuwatch profile my-run --steps 10
    """
    from gpuwatch.client import profile_request
    from gpuwatch.store import profiles

    conn, find = resolve_run(db)
    try:
        if show:
            target = find(run)
            found = profiles.profiles(conn, target.run_id)
            if not found:
                raise click.ClickException(f"run {target.run_id} has no profiles yet")
            shown = found[0]
        else:
            asked = profile_request.ask(load_config(), reader_db_path(db), run, steps)
            click.echo(asked.line, err=True)
            if not wait:
                return
            landed = profile_request.wait(reader_db_path(db), asked, wait)
            if landed is None:
                raise click.ClickException(
                    f"no profile from run {asked.run_id} within {wait:g}s "
                    f"(slow steps? it will still land; see --show)"
                )
            shown = landed
        click.echo(
            profile_text(
                shown, profiles.profile_ops(conn, shown.id), profiles.profile_breakdown(conn, shown.id)
            )
        )
    finally:
        conn.close()

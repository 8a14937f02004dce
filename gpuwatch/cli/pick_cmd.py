"""`gpuwatch pick`: the GPUs that fit a job now, from the last minutes of samples."""

from __future__ import annotations

import os
import pwd

import click

from gpuwatch.cli.options import db_option, friendly_errors, load_config, pick_rule_options, reader_db_path


def pick(
    count: int, mem: str, max_util: float, window_min: float, prometheus: str | None, db: str | None
) -> list[list]:
    """Groups of `count` GPUs that fit, best first (one group per host); NothingFits when none."""
    from gpuwatch.analysis.capacity import parse_size
    from gpuwatch.fleet.pick import choose, fleet_candidates, local_candidates
    from gpuwatch.fleet.prometheus import Prometheus, PrometheusError

    try:
        mem_bytes = parse_size(mem)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--mem") from None
    cfg = load_config()
    url = cfg.prometheus_url if prometheus is None else prometheus
    if url:
        try:
            prom = Prometheus(url, cfg.prometheus_timeout)
            try:
                candidates = fleet_candidates(prom, int(window_min * 60))
            finally:
                prom.close()
        except PrometheusError as e:
            raise click.ClickException(str(e)) from None
    else:
        from gpuwatch.store import now_ms, open_ro

        conn = open_ro(reader_db_path(db))
        try:
            candidates = local_candidates(conn, now_ms() - int(window_min * 60_000))
        finally:
            conn.close()
    return choose(candidates, count, mem_bytes, max_util, pwd.getpwuid(os.getuid()).pw_name)


def visible_devices(count: int) -> str:
    """CUDA_VISIBLE_DEVICES for `gpuwatch run --pick N`: this host's N best GPUs, with pick's
    defaults; exits 1 with pick's reason when they are not there."""
    from gpuwatch.fleet.pick import NothingFits

    try:
        [best, *_] = pick(count, "1GiB", 10.0, 5.0, prometheus="", db=None)
    except NothingFits as e:
        raise click.ClickException(f"--pick {count}: {e}") from None
    return ",".join(str(c.index) for c in best)


def _table(groups: list[list]) -> str:
    from gpuwatch.base import fmt

    lines = [f"{'HOST':<20} {'GPU':>3} {'FREE (min)':>11} {'UTIL (mean)':>11}  USERS"]
    for group in groups:
        for c in group:
            lines.append(
                f"{(c.host or 'this host')[:20]:<20} {c.index:>3} {fmt.size(c.free_bytes):>11} "
                f"{c.util_pct:>9.0f} %  {', '.join(c.users) or '-'}"
            )
    return "\n".join(lines)


@click.command("pick")
@click.option(
    "--count",
    "-n",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPUs wanted (on one host).",
)
@pick_rule_options
@click.option(
    "--prometheus",
    metavar="URL",
    help="Pick across the fleet from this Prometheus (default: prometheus_url in the config).",
)
@db_option
@friendly_errors
def pick_cmd(
    count: int, mem: str, max_util: float, window_min: float, prometheus: str | None, db: str | None
) -> None:
    """Print the GPUs that fit, best first; exit 1 with the reason when none does.

    A GPU fits when it kept at least --mem free, averaged at most --max-util % and held no other
    user's process over the last --window minutes. Locally the last line is
    CUDA_VISIBLE_DEVICES=…; with Prometheus each line is a host and its GPU indices.

    Example: export $(gpuwatch pick -n 2 --mem 40G)
    """
    from gpuwatch.fleet.pick import NothingFits

    try:
        groups = pick(count, mem, max_util, window_min, prometheus, db)
    except NothingFits as e:
        raise click.ClickException(str(e)) from None
    click.echo(_table(groups), err=True)  # stdout carries only what a script uses
    for group in groups:
        indices = ",".join(str(c.index) for c in group)
        host = group[0].host
        click.echo(f"CUDA_VISIBLE_DEVICES={indices}" if host is None else f"{host} {indices}")

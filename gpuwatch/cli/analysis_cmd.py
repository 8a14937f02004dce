"""`gpuwatch compare`, `gpuwatch export`, `gpuwatch report`: post-run analysis commands."""

from __future__ import annotations

import dataclasses
import json
import sys
from contextlib import closing
from pathlib import Path

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path
from gpuwatch.store import open_ro


def _open(db: str | None):
    return closing(open_ro(reader_db_path(db)))


@click.command("compare")
@click.argument("runs", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--color/--no-color", default=None, help="Colour changes (default: when a terminal).")
@db_option
@friendly_errors
def compare_cmd(runs, as_json, color, db):
    """Compare RUNS side by side; changes are against the first run.

    Each RUN is a run id, a unique id prefix or a run name (the newest with that name).
    Shown: the config keys (git commit, command) that differ; tokens/s and step time (mean,
    p50, p90), peak CUDA memory, mean MFU, GPU utilisation of the run's GPUs while it ran;
    final and best loss, and the loss at equal tokens seen (the shortest run's); energy (kWh,
    J/token); duration, steps and end state; then where each run was slower per token than the
    first and why (as `gpuwatch why`), and the loss against tokens seen, as a chart.
    """
    from gpuwatch.analysis.compare import compare, table
    from gpuwatch.analysis.loss import loss_curve
    from gpuwatch.analysis.why.versus import lines as why_lines
    from gpuwatch.analysis.why.versus import versus

    with _open(db) as conn:
        stats = compare(conn, runs)
        curves = [loss_curve(conn, s.run_id) for s in stats]
        why = (
            []
            if as_json
            else [
                line
                for s in stats[1:]
                for line in why_lines(
                    versus(conn, s.run_id, stats[0].run_id),
                    s.name or s.run_id,
                    stats[0].name or stats[0].run_id,
                )
            ]
        )
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(s) for s in stats], indent=1))
        return
    header, rows = table(stats)
    colour = sys.stdout.isatty() if color is None else color
    widths = [max(len(r[i][0]) for r in [[(h, 0) for h in header], *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    for row in rows:
        cells = []
        for (text, verdict), w in zip(row, widths):
            padded = text.ljust(w)
            if colour and verdict:
                padded = click.style(padded, fg="green" if verdict > 0 else "red")
            cells.append(padded)
        lines.append("  ".join(cells).rstrip())
    click.echo("\n".join(lines), color=colour)
    if why:
        click.echo("")
        click.echo("\n".join(why))
    if any(c.by_steps for c in curves):
        from gpuwatch.cli.charts import loss_chart

        by_tokens = all(c.tokens_known for c in curves if c.by_steps)
        click.echo("")
        click.echo(
            loss_chart(
                [(s.name or s.run_id, c.axis(by_tokens)) for s, c in zip(stats, curves)],
                "tokens" if by_tokens else "steps",
                colour,
            ),
            color=colour,
        )


@click.command("export")
@click.argument("run")
@click.argument("file", required=False, type=click.Path())
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "json", "parquet", "sqlite", "tensorboard"]),
    default="csv",
    show_default=True,
    help="json: one document; csv/parquet: one file per table; sqlite: one "
    "self-contained database file; tensorboard: event files for TensorBoard.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(),
    default=None,
    help="json: a file ('-' or none: stdout). csv/parquet: a directory (default: "
    "./RUN_ID-export). sqlite: a new file (default: ./RUN_ID.db). tensorboard: "
    "a log directory (default: ./runs); files go to DIR/gpuwatch/NAME-ID/. "
    "Or give it as FILE.",
)
@click.option(
    "--follow",
    is_flag=True,
    help="tensorboard: keep mirroring RUN (and its rank runs) while it runs; end with it.",
)
@db_option
@friendly_errors
def export_cmd(run, file, fmt, output, follow, db):
    """Export RUN's row, steps, its GPUs' samples over its lifetime and its events.

    --format tensorboard writes TensorBoard event files beside your own logs: per step tokens/s,
    step time, loss (and each optimiser's), data wait, MFU, CUDA memory; per GPU of the run
    utilisation, SM activity, memory, power, temperature, clocks and throttle reasons; energy,
    J/token, the OOM postmortem and profile breakdowns as text; the config as hparams. Point
    `tensorboard --logdir DIR` at the same DIR as your script's logs to see both.

    --format sqlite writes one SQLite file with the whole schema holding this run alone: also its
    generations, memory stats, OOM postmortems, profiles and their operators, stack dumps and
    notes; open it with any SQLite tool or `gpuwatch show --db FILE RUN`.

    Parquet needs pyarrow (pip install pyarrow). GPU samples are the raw samples still kept
    (raw_retention_hours); older parts of a long run survive only as rollups.

    Examples: gpuwatch export gpt-4k --format sqlite gpt-4k.db
              gpuwatch export gpt-4k --format tensorboard runs/
    """
    from gpuwatch.analysis.export import ExportError, run_tables, write_files, write_json

    if file and output:
        raise click.UsageError("give the output as FILE or as -o, not both")
    output = output or file
    if follow and fmt != "tensorboard":
        raise click.UsageError("--follow needs --format tensorboard")
    if fmt == "tensorboard":
        _export_tensorboard(run, Path(output or "runs"), follow, db)
        return
    if fmt in ("json", "sqlite") and output and Path(output).is_dir():
        raise click.UsageError(f"{output} is a directory; --format {fmt} writes one file")
    if fmt == "sqlite":
        from gpuwatch.analysis.runfile import write_run_file
        from gpuwatch.store import queries

        with _open(db) as conn:
            target = Path(output or f"{queries.run(conn, run).run_id}.db")
            try:
                counts = write_run_file(conn, run, target)
            except ExportError as e:
                raise click.ClickException(str(e)) from None
        click.echo(f"wrote {target}: " + ", ".join(f"{n} {t}" for t, n in counts.items() if n), err=True)
        return
    with _open(db) as conn:
        tables = run_tables(conn, run)
        if fmt == "json":
            if output in (None, "-"):
                write_json(tables, sys.stdout)
            else:
                with open(output, "w") as f:
                    write_json(tables, f)
                click.echo(f"wrote {output}", err=True)
            return
        run_id = tables["run"][0]["run_id"]
        directory = Path(output) if output else Path(f"{run_id}-export")
        try:
            written = write_files(conn, tables, fmt, directory)
        except ExportError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:
            raise click.ClickException(f"cannot write {directory}: {e.strerror or e}") from None
    for path in written:
        click.echo(f"wrote {path}", err=True)


def _export_tensorboard(ref: str, root: Path, follow: bool, db: str | None) -> None:
    from gpuwatch.analysis import tensorboard
    from gpuwatch.store import queries

    path = reader_db_path(db)
    try:
        if follow:
            with _open(db) as conn:
                run = queries.run(conn, ref)
            click.echo(
                f"mirroring {run.run_id} into {root / 'gpuwatch'} until it ends (Ctrl-C stops)", err=True
            )
            written = tensorboard.follow(
                lambda: open_ro(path),
                tensorboard.Selection(run.run_id),
                str(root),
                Path.cwd(),
                None,
                say=lambda line: click.echo(line, err=True),
            )
        else:
            with _open(db) as conn:
                written = [tensorboard.export(conn, ref, root)]
    except OSError as e:
        raise click.ClickException(f"cannot write {root}: {e.strerror or e}") from None
    for directory in written:
        click.echo(f"wrote {directory}", err=True)


@click.command("report")
@click.argument("run")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="HTML file to write (default: ./RUN_ID.html).",
)
@db_option
@friendly_errors
def report_cmd(run, output, db):
    """Write one self-contained HTML report of RUN: figures, charts, slowdowns and their causes,
    config, OOM postmortem."""
    from gpuwatch.analysis.report import render
    from gpuwatch.store import queries

    with _open(db) as conn:
        html = render(conn, run)
        path = Path(output) if output else Path(f"{queries.run(conn, run).run_id}.html")
    try:
        path.write_text(html, encoding="utf-8")
    except OSError as e:
        raise click.ClickException(f"cannot write {path}: {e.strerror or e}") from None
    click.echo(f"wrote {path}")

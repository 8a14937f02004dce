"""`gpuwatch query "SQL"`: read-only SQL over the database, as a table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import shutil
import sys

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value).replace("\n", " ")


MIN_COLUMN = 5
GAP = 2


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_records(headers: list[str], rows: list, width: int = 80) -> str:
    """One `name  value` line per column, a rule between rows: for rows too wide for a table."""
    name_width = min(max(len(h) for h in headers), width // 3)
    out = []
    for n, row in enumerate(rows, 1):
        out.append(_cut(f"-[ row {n} ]" + "-" * width, width))
        out += [
            f"{_cut(h, name_width).ljust(name_width)}  {_cut(_cell(v), width - name_width - 2)}".rstrip()
            for h, v in zip(headers, row)
        ]
    return "\n".join(out)


def format_table(headers: list[str], rows: list, width: int = 80, right: set[int] | None = None) -> str:
    """Aligned plain-text columns; the widest columns are cut (with …) until the line fits `width`.

    With too many columns to fit even when cut, each row is printed as records instead.
    """
    if MIN_COLUMN * len(headers) + GAP * (len(headers) - 1) > width:
        return format_records(headers, rows, width)
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    gap = GAP
    while sum(widths) + gap * (len(widths) - 1) > width:
        widest = widths.index(max(widths))
        widths[widest] -= 1
    if right is None:
        right = {
            i
            for i in range(len(headers))
            if rows and all(isinstance(r[i], (int, float)) or r[i] is None for r in rows)
        }

    def fit(text: str, i: int) -> str:
        text = _cut(text, widths[i])
        return text.rjust(widths[i]) if i in right else text.ljust(widths[i])

    lines = [(" " * gap).join(fit(h, i) for i, h in enumerate(headers)).rstrip()]
    lines += [(" " * gap).join(fit(c, i) for i, c in enumerate(r)).rstrip() for r in cells]
    return "\n".join(lines)


def echo_data(headers: list[str], rows: list, fmt: str) -> None:
    """Rows for scripts: a JSON list of objects, or CSV with a header line."""
    if fmt == "json":
        click.echo(json.dumps([dict(zip(headers, r)) for r in rows], default=_cell, indent=2))
    else:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(rows)


@click.command("query")
@click.argument("sql")
@db_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output format.",
)
@friendly_errors
def query(sql, db, fmt):
    """Run one read-only SQL statement against the database.

    \b
    Examples:
      gpuwatch query "SELECT gpu_index, max(temp_c) FROM gpu_samples GROUP BY 1"
      gpuwatch query "SELECT * FROM runs" --format csv > runs.csv
    """
    from gpuwatch.store import open_ro
    from gpuwatch.store.adhoc import QueryError, read_only_query

    conn = open_ro(reader_db_path(db))
    try:
        headers, rows = read_only_query(conn, sql)
    except QueryError as e:
        raise click.ClickException(str(e)) from None
    finally:
        conn.close()
    if fmt in ("json", "csv"):
        echo_data(headers, rows, fmt)
    elif headers:
        width = shutil.get_terminal_size((80, 24)).columns
        click.echo(format_table(headers, rows, width))
        click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", err=True)

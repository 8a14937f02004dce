"""`gpuwatch capacity -- CMD`: the longest sequence each batch size fits, measured small and checked."""

from __future__ import annotations

import click

from gpuwatch.base import fmt
from gpuwatch.cli.options import friendly_errors, load_config


def study_text(study) -> str:
    lines = [
        f"device {study.device}: limit {fmt.size(study.limit_bytes)}, margin {study.margin:.0%} "
        f"-> budget {fmt.size(study.budget_bytes)}",
        f"{'BATCH':>5} {'SEQ_LEN':>8} {'MEASURED':>10} {'FITTED':>10}  KIND",
    ]
    for p in study.points:
        fit = study.fits.get(p.batch)
        measured = fmt.size(p.peak_bytes) if p.ok else "OOM"
        fitted = fmt.size(fit.peak(p.seq_len)) if fit else "-"
        lines.append(f"{p.batch:>5} {p.seq_len:>8} {measured:>10} {fitted:>10}  {p.kind}")
    for batch, pred in study.predicted.items():
        line = (
            f"batch {batch}: max seq_len {pred['max_seq_len']} "
            f"(predicted peak {fmt.size(pred['predicted_peak_bytes'])}"
        )
        verified = pred.get("verified_peak_bytes")
        if pred.get("verified_ok") is False:
            line += "; the check ran OUT OF MEMORY: use a larger --margin"
        elif verified:
            error = (verified - pred["predicted_peak_bytes"]) / pred["predicted_peak_bytes"]
            line += f", measured {fmt.size(verified)}, {error:+.1%}"
        lines.append(line + ")")
    lines.extend(study.notes)
    return "\n".join(lines)


@click.command(
    "capacity", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.option("--batch", "batches", default="1,4", show_default=True, help="Batch sizes, comma-separated.")
@click.option(
    "--lengths",
    default="128,256,512,1024",
    show_default=True,
    help="Sequence lengths to measure, comma-separated (small: the fit extrapolates).",
)
@click.option(
    "--margin",
    type=click.FloatRange(0, 0.9),
    default=0.1,
    show_default=True,
    help="Headroom kept free: predict for limit x (1 - margin).",
)
@click.option(
    "--limit",
    help="Memory limit, e.g. 8GiB (default: the GPU's total memory; on a CPU "
    "the cgroup limit or available memory).",
)
@click.option("--no-verify", is_flag=True, help="Skip the check run at each predicted length.")
@click.option(
    "--db", type=click.Path(dir_okay=False), help="Where to store the study (default: your database)."
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@friendly_errors
def capacity_cmd(batches, lengths, margin, limit, no_verify, db, command) -> None:
    """Predict the longest sequence length per batch size before running out of memory: runs
    COMMAND a few steps at small lengths (appending --seq-len L --batch B --steps 2), fits
    peak = a + b*L + c*L^2, predicts, then runs at the prediction to check it.

    Example: gpuwatch capacity --batch 1,4 --limit 8GiB -- python -m workloads.gpt_train --attn naive
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from gpuwatch.analysis import capacity

    try:
        batch_list = capacity.parse_ints(batches)
        length_list = capacity.parse_ints(lengths)
        limit_bytes = capacity.parse_size(limit) if limit else None
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if len(length_list) < 2:
        raise click.ClickException("--lengths: give at least two lengths (three or more for a curve)")
    db_path = db or load_config().db_path
    total = len(batch_list) * (len(length_list) + (0 if no_verify else 1))
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task("starting", total=total)
        started = 0

        def progress(what: str) -> None:  # called as each run starts: the ones before are done
            nonlocal started
            bar.update(task, description=what, completed=started)
            started += 1

        try:
            study = capacity.run_study(
                list(command),
                batch_list,
                length_list,
                margin,
                limit_bytes,
                verify=not no_verify,
                progress=progress,
            )
        except capacity.CapacityError as e:
            raise click.ClickException(str(e)) from None
    study_id = capacity.save_study(db_path, study)
    click.echo(study_text(study))
    click.echo(f"stored as capacity study {study_id} in {db_path}", err=True)

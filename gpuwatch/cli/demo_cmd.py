"""`gpuwatch demo`: run small reference workloads, then show the runs they recorded.

The demo is a list of stages, each one workload in a child process (the CLI itself never imports
torch); adding a stage is adding one Stage to STAGES.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from gpuwatch.cli.options import db_option, friendly_errors, reader_db_path
from gpuwatch.cli.tui_cmd import on_a_terminal, run_tui

STAGE_TIMEOUT_S = 300
# With --db the workloads must write that file themselves: a socket path nothing listens on
# keeps them from handing their events to a running daemon instead.
NO_DAEMON_SOCKET = os.devnull


@dataclass(frozen=True)
class Stage:
    title: str  # what the user sees on the progress line
    module: str  # workloads.<module>
    run_name: str  # the run it must leave in the database
    args: tuple[str, ...] = ()
    expect_failure: bool = False  # for stages that demonstrate a failure (an OOM, say)
    address_space_bytes: int | None = None  # RLIMIT_AS for the child: a host OOM on any machine

    def argv(self) -> list[str]:
        return [sys.executable, "-m", f"workloads.{self.module}", *self.args, "--name", self.run_name]


STAGES: list[Stage] = [
    Stage(
        "training: GPT decoder learning to count, 30 steps",
        "gpt_train",
        "demo-train",
        ("--tiny", "--steps", "30", "--vocab", "64", "--lr", "1e-2"),
    ),
    Stage("generation: KV-cache decoding", "kv_generate", "demo-decode", ("--tiny", "--generations", "3")),
]


def oom_stage(gpu: bool) -> Stage:
    """Naive attention materialises B·H·L² scores: on a GPU 8·4·65536²·4 bytes (512 GiB) is past
    any GPU; on a CPU 4·4·16384²·4 bytes (16 GiB) is refused under a 4 GiB address-space limit
    (CUDA itself needs more address space than such a limit allows). A real allocator failure."""
    args = ("--tiny", "--attn", "naive", "--heads", "4", "--steps", "2")
    if gpu:
        return Stage(
            "OOM: naive attention at L=65536 on the GPU",
            "gpt_train",
            "demo-oom",
            (*args, "--seq-len", "65536", "--batch", "8"),
            expect_failure=True,
        )
    return Stage(
        "OOM: naive attention at L=16384 under a 4 GiB memory limit",
        "gpt_train",
        "demo-oom",
        (*args, "--seq-len", "16384", "--batch", "4", "--device", "cpu"),
        expect_failure=True,
        address_space_bytes=4 << 30,
    )


STAGES.append(oom_stage(gpu=Path("/dev/nvidiactl").exists()))


def _summary(stdout: str) -> list[str]:
    """The workload's human summary: its last lines, without the machine-readable result line."""
    lines = [line for line in stdout.splitlines() if line.strip() and not line.startswith("GPUWATCH_RESULT")]
    return lines[-2:]


def run_stage(stage: Stage, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    limit = stage.address_space_bytes
    try:
        done = subprocess.run(
            stage.argv(),
            env=env,
            capture_output=True,
            text=True,
            timeout=STAGE_TIMEOUT_S,
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))) if limit else None,
        )
    except subprocess.TimeoutExpired:
        raise click.ClickException(
            f"demo stage '{stage.title}' took over {STAGE_TIMEOUT_S}s; stopped it"
        ) from None
    return done, time.monotonic() - started


def _last_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else "no error output"


def _client_warnings(stderr: str) -> list[str]:
    """What gpuwatch's client said about recording the run (refused or dropped events, say)."""
    return [line.strip() for line in stderr.splitlines() if line.startswith("gpuwatch:")]


@click.command("demo")
@db_option
@click.option("--no-tui", is_flag=True, help="Only print the runs; do not open the TUI on them afterwards.")
@friendly_errors
def demo_cmd(db, no_tui) -> None:
    """Run a short training and a short generation workload (seconds on a CPU), then one that runs
    out of memory (a real allocator failure, with its postmortem), then list the runs.

    Needs no daemon and no root: with none running, the workloads write your own database.

    Example: gpuwatch demo --db /tmp/demo.db
    """
    if importlib.util.find_spec("torch") is None:
        raise click.ClickException(
            "the demo runs small PyTorch workloads, and torch is not installed "
            "(pip install 'gpuwatch[torch]')"
        )
    env = dict(os.environ)
    # The demo's models are tiny: one CPU thread runs them faster than many fighting over
    # small matmuls, and leaves a shared server's other cores alone. The user's setting wins.
    env.setdefault("OMP_NUM_THREADS", "1")
    if db:
        db = str(Path(db).expanduser().resolve())
        env.update(GPUWATCH_DB=db, GPUWATCH_SOCKET=NO_DAEMON_SOCKET)
    started_ms = int(time.time() * 1000)
    warned: set[str] = set()  # each stage's gpuwatch says the same of this host: shown once
    for number, stage in enumerate(STAGES, 1):
        click.echo(
            f"[{number}/{len(STAGES)}] {stage.title} (python -m workloads.{stage.module} "
            f"{' '.join(stage.argv()[3:])}) ..."
        )
        done, seconds = run_stage(stage, env)
        if (done.returncode != 0) != stage.expect_failure:
            raise click.ClickException(
                f"demo stage '{stage.title}' exited with code {done.returncode}: "
                f"{_last_error_line(done.stderr)}"
            )
        shown = [_last_error_line(done.stderr)[-160:]] if stage.expect_failure else _summary(done.stdout)
        for line in shown:
            click.echo(f"      {line.strip()}")
        for line in _client_warnings(done.stderr):
            if line not in warned:
                warned.add(line)
                click.echo(f"      warning: {line}")
        click.echo(f"      done in {seconds:.1f}s")
    show_runs(db, started_ms)
    if not no_tui and on_a_terminal():
        click.echo("\nopening the TUI on these runs (q quits) ...")
        time.sleep(2)  # long enough to read where the runs went before the screen changes
        run_tui(reader_db_path(db), start_mode="runs")


def show_runs(db: str | None, since_ms: int) -> None:
    from gpuwatch.cli.runs_cmd import runs_table
    from gpuwatch.store import now_ms, open_ro, queries

    path = reader_db_path(db)
    conn = open_ro(path)
    try:
        summaries = queries.runs(conn, since_ms=since_ms, limit=len(STAGES) * 4)
    finally:
        conn.close()
    missing = {s.run_name for s in STAGES} - {r.name for r in summaries}
    if missing:
        raise click.ClickException(
            f"the workloads ran, but {path} holds no run named "
            f"{', '.join(sorted(missing))} (see the warnings above)"
        )
    click.echo("")
    click.echo(f"runs recorded in {path}:")
    click.echo(runs_table(summaries, now_ms()))
    db_flag = f" --db {db}" if db else ""
    train_id = next(r.run_id for r in summaries if r.name == STAGES[0].run_name)
    click.echo("")
    click.echo("look closer:")
    click.echo(f"  gpuwatch show{db_flag} {train_id}    one run: tokens/s over time, memory, config")
    click.echo(f"  gpuwatch runs{db_flag}    every run")
    click.echo(f"  gpuwatch oom{db_flag} demo-oom    the OOM postmortem: requested vs free, advice")
    click.echo(f"  gpuwatch tui{db_flag}     the live view")

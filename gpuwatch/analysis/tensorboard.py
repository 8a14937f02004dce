"""A run's figures as TensorBoard event files, beside the user's own: for a past run in one pass
(`gpuwatch export RUN --format tensorboard DIR`), or live while it runs (`--follow`, which
`gpuwatch run --tensorboard DIR` and `autolog(tensorboard=DIR)` start in a process of their own).

Written with TensorBoard's own event-file writer and protos; scalars are classic scalar summaries
(`simple_value`), which every reader sees as scalars. Tags:
  gpuwatch/step/…    per step (global step = the run's step): tokens/s, step time, loss and the
                     per-optimiser losses, data wait, MFU, CUDA memory (MiB), host RSS
  gpuwatch/generation/…  per generate() call of a serving run: tokens/s, TTFT, inter-token
                     latency (p50, p90), prompt and new tokens
  gpuwatch/gpuN/…    per GPU of the run over its lifetime (step = seconds since the run began):
                     utilisation, SM activity, memory used, power, temperature, clocks, and each
                     throttle reason as a 0/1 series
  gpuwatch/run/…     energy (kWh) and J/token at the last step; the OOM postmortem, the profile
                     breakdowns and a summary as text; the run's config as hparams
Each run goes to DIR/gpuwatch/<name>-<id8>/, so one --logdir shows it next to the user's runs.
Nothing here is imported unless a TensorBoard export is asked for.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpuwatch.analysis.postmortem_text import show_text
from gpuwatch.analysis.rundata import run_gpus, run_window
from gpuwatch.base import fmt
from gpuwatch.store import energy as energy_mod
from gpuwatch.store import postmortems, profiles, queries

MIB = 1 << 20
BATCH_ROWS = 5000  # rows read per query, so a long run's first pass stays small in memory

# steps column -> (tag under gpuwatch/step/, scale)
STEP_SERIES = (
    ("tokens_per_s", "tokens_per_s", 1.0),
    ("step_time_ms", "step_time_ms", 1.0),
    ("loss", "loss", 1.0),
    ("data_wait_pct", "data_wait_pct", 1.0),
    ("mfu", "mfu_pct", 100.0),
    ("mem_allocated_bytes", "cuda_allocated_mib", 1 / MIB),
    ("mem_reserved_bytes", "cuda_reserved_mib", 1 / MIB),
    ("mem_peak_bytes", "cuda_peak_mib", 1 / MIB),
    ("rss_bytes", "host_rss_mib", 1 / MIB),
)
# generations column -> (tag under gpuwatch/generation/, scale); x axis: the generation's number
GENERATION_SERIES = (
    ("tokens_per_s", "tokens_per_s", 1.0),
    ("ttft_ms", "ttft_ms", 1.0),
    ("itl_p50_ms", "itl_p50_ms", 1.0),
    ("itl_p90_ms", "itl_p90_ms", 1.0),
    ("prompt_tokens", "prompt_tokens", 1.0),
    ("new_tokens", "new_tokens", 1.0),
)
# what the hparams table shows beside each run's config
HPARAMS_METRICS = ("tokens_per_s", "loss", "step_time_ms")
# gpu_samples column -> (tag under gpuwatch/gpuN/, scale)
GPU_SERIES = (
    ("gpu_util_pct", "util_pct", 1.0),
    ("mem_used_bytes", "mem_used_mib", 1 / MIB),
    ("power_mw", "power_w", 1e-3),
    ("temp_c", "temp_c", 1.0),
    ("sm_clock_mhz", "sm_clock_mhz", 1.0),
    ("mem_clock_mhz", "mem_clock_mhz", 1.0),
)


def run_dir(root: Path, run: queries.Run) -> Path:
    """DIR/gpuwatch/<name>-<id8>: the directory one run's event files go to."""
    label = run.name or (f"rank{run.rank}" if run.rank is not None else "run")
    label = re.sub(r"[^\w.+=-]+", "_", label).strip("_") or "run"
    return root / "gpuwatch" / f"{label}-{run.run_id[:8]}"


def _scalar(tag: str, value: float):
    from tensorboard.compat.proto.summary_pb2 import Summary

    return Summary.Value(tag=tag, simple_value=value)


def _text(tag: str, text: str):
    """A text summary as TensorBoard's text plugin reads it (a string tensor)."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.compat.proto.tensor_pb2 import TensorProto
    from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
    from tensorboard.compat.proto.types_pb2 import DT_STRING

    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    tensor = TensorProto(
        dtype=DT_STRING,
        string_val=[text.encode()],
        tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
    )
    return Summary.Value(tag=tag, metadata=meta, tensor=tensor)


def _preformatted(text: str) -> str:
    """Markdown that keeps a text table's columns: every line indented as code."""
    return "\n".join("    " + line for line in text.splitlines())


def hparams_values(run: queries.Run, attached: dict) -> dict[str, float | str | bool]:
    """The run's config (or its instrumented child's, under `gpuwatch run`) flattened to
    TensorBoard hparams (dotted keys), and what ran."""
    values: dict[str, float | str | bool] = {}

    def flatten(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                flatten(f"{prefix}.{key}" if prefix else str(key), sub)
        elif isinstance(value, bool | str):
            values[prefix] = value
        elif isinstance(value, int | float):
            values[prefix] = float(value)
        elif value is not None:
            values[prefix] = json.dumps(value)

    flatten("", run.config or attached.get("config") or {})
    for key in ("name", "command", "git_commit", "torch_version", "cuda_version", "host", "user"):
        if getattr(run, key):
            values.setdefault(key, getattr(run, key))
    return values


def _hparams_plugin_value(tag: str, **data):
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    content = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **data)
    meta = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString()
        )
    )
    return Summary.Value(tag=tag, metadata=meta)


def _hparams_start(run: queries.Run, values: dict) -> list:
    """TensorBoard's hparams plugin data for the run: the experiment (its hparams and the
    metrics to show beside them) and the session start; torch's SummaryWriter.add_hparams
    builds the same messages."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo(group_name=run.run_id, start_time_secs=run.started_ms / 1000)
    for key, value in values.items():
        if isinstance(value, bool):
            start.hparams[key].bool_value = value
        elif isinstance(value, float):
            start.hparams[key].number_value = value
        else:
            start.hparams[key].string_value = value
    experiment = api_pb2.Experiment(
        hparam_infos=[api_pb2.HParamInfo(name=key) for key in values],
        metric_infos=[
            api_pb2.MetricInfo(name=api_pb2.MetricName(tag=f"gpuwatch/step/{tag}")) for tag in HPARAMS_METRICS
        ],
    )
    return [
        _hparams_plugin_value(metadata.EXPERIMENT_TAG, experiment=experiment),
        _hparams_plugin_value(metadata.SESSION_START_INFO_TAG, session_start_info=start),
    ]


def _hparams_end(run: queries.Run):
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    status = api_pb2.STATUS_SUCCESS if run.status == "finished" else api_pb2.STATUS_FAILURE
    end = plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=(run.ended_ms or 0) / 1000)
    return _hparams_plugin_value(metadata.SESSION_END_INFO_TAG, session_end_info=end)


def throttle_tag(word: str) -> str:
    return re.sub(r"\W+", "_", word.lower()).strip("_")


@dataclass
class RunMirror:
    """What of one run is already in its event files, so each update writes only what is new."""

    run_id: str
    directory: Path
    last_step: int = -1
    last_generation: int = -1
    last_step_ts_ms: int = 0
    gpu_after_ms: dict[int, int] = field(default_factory=dict)  # GPU -> newest sample written
    prof_after_ms: dict[int, int] = field(default_factory=dict)
    profiles_done: set[int] = field(default_factory=set)
    tokens: int = 0
    started: bool = False
    closed: bool = False
    _writer: object = None

    def _add(self, wall_ms: int, step: int, values: list) -> None:
        if not values:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.directory))
        self._writer.add_event(Event(wall_time=wall_ms / 1000, step=step, summary=Summary(value=values)))

    def update(self, conn: sqlite3.Connection) -> int:
        """Write the run's new steps, GPU samples and profiles; returns how many points."""
        run = queries.run(conn, self.run_id)
        written = 0
        if not self.started:
            attached = queries.run_event_payload(conn, run.run_id)
            self._add(run.started_ms, 0, _hparams_start(run, hparams_values(run, attached)))
            self.started = True
        written += self._steps(conn)
        written += self._generations(conn)
        written += self._gpus(conn, run)
        written += self._profiles(conn)
        if (
            written and self._writer is not None
        ):  # on disk at each poll: TensorBoard sees it at its next reload
            self._writer.flush()
        return written

    def _steps(self, conn: sqlite3.Connection) -> int:
        cols = ", ".join(c for c, _, _ in STEP_SERIES)
        written = 0
        while True:
            rows = conn.execute(
                f"SELECT step, ts_ms, tokens, losses_json, {cols} FROM steps "
                "WHERE run_id = ? AND step > ? ORDER BY step LIMIT ?",
                (self.run_id, self.last_step, BATCH_ROWS),
            ).fetchall()
            for step, ts_ms, tokens, losses_json, *figures in rows:
                values = [
                    _scalar(f"gpuwatch/step/{tag}", v * scale)
                    for (_, tag, scale), v in zip(STEP_SERIES, figures)
                    if v is not None
                ]
                for name, loss in (json.loads(losses_json) if losses_json else {}).items():
                    if isinstance(loss, int | float):
                        values.append(_scalar(f"gpuwatch/step/loss/{name}", loss))
                self._add(ts_ms, step, values)
                self.tokens += tokens or 0
                written += len(values)
            if rows:
                self.last_step, self.last_step_ts_ms = rows[-1][0], rows[-1][1]
            if len(rows) < BATCH_ROWS:
                return written

    def _generations(self, conn: sqlite3.Connection) -> int:
        cols = ", ".join(c for c, _, _ in GENERATION_SERIES)
        written = 0
        for gen_id, ts_ms, *figures in conn.execute(
            f"SELECT gen_id, ts_ms, {cols} FROM generations WHERE run_id = ? AND gen_id > ? ORDER BY gen_id",
            (self.run_id, self.last_generation),
        ):
            values = [
                _scalar(f"gpuwatch/generation/{tag}", v * scale)
                for (_, tag, scale), v in zip(GENERATION_SERIES, figures)
                if v is not None
            ]
            self._add(ts_ms, gen_id, values)
            self.last_generation = gen_id
            written += len(values)
        return written

    def _gpus(self, conn: sqlite3.Connection, run: queries.Run) -> int:
        start, end = run_window(conn, run)
        cols = ", ".join(c for c, _, _ in GPU_SERIES)
        written = 0
        for gpu in run_gpus(conn, run):
            after = self.gpu_after_ms.get(gpu, start - 1)
            for ts_ms, throttle, *figures in conn.execute(
                f"SELECT ts_ms, throttle_reasons, {cols} FROM gpu_samples "
                "WHERE gpu_index = ? AND ts_ms > ? AND ts_ms <= ? ORDER BY ts_ms",
                (gpu, after, end),
            ):
                values = [
                    _scalar(f"gpuwatch/gpu{gpu}/{tag}", v * scale)
                    for (_, tag, scale), v in zip(GPU_SERIES, figures)
                    if v is not None
                ]
                if throttle is not None:
                    values += [
                        _scalar(
                            f"gpuwatch/gpu{gpu}/throttle/{throttle_tag(word)}", 1.0 if throttle & bit else 0.0
                        )
                        for bit, word in fmt.THROTTLE_REASONS
                    ]
                self._add(ts_ms, (ts_ms - run.started_ms) // 1000, values)
                self.gpu_after_ms[gpu] = ts_ms
                written += len(values)
            prof_after = self.prof_after_ms.get(gpu, start - 1)
            for ts_ms, sm_active in conn.execute(
                "SELECT ts_ms, sm_active_pct FROM gpu_prof_samples WHERE gpu_index = ? "
                "AND ts_ms > ? AND ts_ms <= ? AND sm_active_pct IS NOT NULL ORDER BY ts_ms",
                (gpu, prof_after, end),
            ):
                self._add(
                    ts_ms,
                    (ts_ms - run.started_ms) // 1000,
                    [_scalar(f"gpuwatch/gpu{gpu}/sm_active_pct", sm_active)],
                )
                self.prof_after_ms[gpu] = ts_ms
                written += 1
        return written

    def _profiles(self, conn: sqlite3.Connection) -> int:
        from gpuwatch.analysis.trace import render

        written = 0
        for profile in profiles.profiles(conn, self.run_id):
            if profile.id in self.profiles_done:
                continue
            breakdown = profiles.profile_breakdown(conn, profile.id)
            if breakdown is None:
                continue  # its analysis has not arrived yet: the next update writes it
            lines = [
                render.headline(breakdown),
                *render.rank_lines(breakdown, width=100),
                *render.advice_lines(breakdown.get("advice") or [], width=100),
            ]
            self._add(
                profile.ts_ms,
                profile.first_step or 0,
                [_text("gpuwatch/run/profile", _preformatted("\n".join(lines)))],
            )
            self.profiles_done.add(profile.id)
            written += 1
        return written

    def close(self, conn: sqlite3.Connection) -> None:
        """The run has ended: write its last figures (energy, J/token, the OOM postmortem, a
        summary, the hparams' end) and close its files."""
        if self.closed:
            return
        self.update(conn)
        run = queries.run(conn, self.run_id)
        step, wall = max(self.last_step, 0), run.ended_ms or self.last_step_ts_ms or run.started_ms
        values = []
        start, end = run_window(conn, run)
        energy = energy_mod.run_energy(conn, {run.run_id: (start, end)}).get(run.run_id)
        if energy is not None:
            values.append(_scalar("gpuwatch/run/energy_kwh", energy.kwh))
            if self.tokens:
                values.append(_scalar("gpuwatch/run/joules_per_token", energy.joules / self.tokens))
        pms = postmortems.for_run(conn, run.run_id)
        if pms:
            values.append(_text("gpuwatch/run/oom_postmortem", _preformatted(show_text(run, pms))))
        values.append(_text("gpuwatch/run/summary", summary_markdown(run, self.tokens, energy)))
        values.append(_hparams_end(run))
        self._add(wall, step, values)
        if self._writer is not None:
            self._writer.close()
        self.closed = True


def summary_markdown(run: queries.Run, tokens: int, energy) -> str:
    rows = [
        ("run", f"{run.name or '-'} ({run.run_id})"),
        ("status", run.status),
        ("user", run.user or str(run.uid)),
        ("host", run.host or "-"),
        ("command", run.command or "-"),
        ("started", fmt.local_time(run.started_ms)),
        ("duration", fmt.duration(run.ended_ms - run.started_ms) if run.ended_ms else "-"),
        ("tokens", fmt.count(tokens) if tokens else "-"),
    ]
    if energy is not None:
        rows.append(("energy", f"{fmt.kwh(energy.joules)} ({fmt.count(energy.joules)} J)"))
    return "| | |\n|---|---|\n" + "\n".join(f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows)


def _clear(directory: Path) -> None:
    """A new export of a run replaces the event files an earlier one left in its directory."""
    for old in directory.glob("events.out.tfevents.*"):
        old.unlink()


def export(conn: sqlite3.Connection, ref: str, root: Path) -> Path:
    """Write RUN's event files under root/gpuwatch/; returns the run's directory."""
    run = queries.run(conn, ref)
    directory = run_dir(root, run)
    _clear(directory)
    mirror = RunMirror(run.run_id, directory)
    mirror.close(conn)
    return directory


def find_user_logdir(cwd: Path, since_ms: int, max_depth: int = 5) -> Path | None:
    """The directory where the program writes TensorBoard logs of its own (a Hugging Face
    `output_dir/runs/<date>_<host>`, a Lightning `lightning_logs/version_N`, a SummaryWriter's
    `runs/...`): the one holding the newest event file written since `since_ms`, ours aside."""
    newest: tuple[float, Path] | None = None
    base_depth = len(cwd.parts)
    for dirpath, dirnames, filenames in os.walk(cwd, onerror=lambda e: None):
        path = Path(dirpath)
        if len(path.parts) - base_depth >= max_depth:
            dirnames.clear()
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS]
        for name in filenames:
            if name.startswith("events.out.tfevents."):
                try:
                    mtime = (path / name).stat().st_mtime
                except OSError:
                    continue
                if mtime * 1000 >= since_ms and (newest is None or mtime > newest[0]):
                    newest = (mtime, path)
    return newest[1] if newest else None


_SKIP_DIRS = {"gpuwatch", "node_modules", "site-packages", "__pycache__", "wandb"}


def named_output_dirs(conn: sqlite3.Connection, run_ids: list[str], cwd: Path) -> list[Path]:
    """Output directories outside `cwd` that the runs' own configs name: a Hugging Face
    Trainer's `training_args.output_dir` (its TensorBoard logs go under it, wherever it is), in
    the config of a run it started or of the one it attached to (a relative one is cwd's)."""
    configs: list[Any] = []
    for run_id in run_ids:
        run = queries.run_by_id(conn, run_id)
        configs += [run and run.config, queries.run_event_payload(conn, run_id).get("config")]
    here, found = cwd.resolve(), []
    for config in configs:
        args = config.get("training_args") if isinstance(config, dict) else None
        named = args.get("output_dir") if isinstance(args, dict) else None
        if isinstance(named, str) and named:
            path = (cwd / named).resolve()
            if not path.is_relative_to(here) and path not in found:
                found.append(path)
    return found


@dataclass
class Selection:
    """Which runs a live mirror follows: a `gpuwatch run` wrapper's run and its rank runs, or
    every run a process (an autolog'd notebook) starts from `since_ms` on."""

    wrapper_run_id: str | None = None
    pid: int | None = None
    since_ms: int = 0

    def run_ids(self, conn: sqlite3.Connection) -> list[tuple[str, str]]:
        """(run_id, status) of the runs to mirror now."""
        if self.wrapper_run_id:
            return conn.execute(
                "SELECT run_id, status FROM runs WHERE run_id = ? OR parent_run_id = ? ORDER BY started_ms",
                (self.wrapper_run_id,) * 2,
            ).fetchall()
        return conn.execute(
            "SELECT run_id, status FROM runs WHERE pid = ? AND started_ms >= ? ORDER BY started_ms",
            (self.pid, self.since_ms),
        ).fetchall()


def _alive(pid: int | None) -> bool:
    """The process runs (a zombie its parent has not reaped yet has ended)."""
    import psutil

    if pid is None:
        return True
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def follow(
    open_conn: Callable[[], sqlite3.Connection],
    selection: Selection,
    target: str,
    cwd: Path,
    watch_pid: int | None,
    poll_s: float = 2.0,
    say: Callable[[str], None] = print,
) -> list[Path]:
    """Mirror the selected runs into TensorBoard files while they run; returns their directories.

    target: a directory (files go to target/gpuwatch/...), or "auto": beside the logs the program
    writes itself, once it has written some (under cwd, or under an output directory its runs'
    configs name). Ends when every selected run has ended and the wrapper's run (or, for a
    process's runs, the process) is over, or when `watch_pid` is gone."""
    root = None if target == "auto" else Path(target)
    mirrors: dict[str, RunMirror] = {}
    while True:
        watched_gone = not _alive(watch_pid)
        with closing(open_conn()) as conn:
            if root is None:
                found = find_user_logdir(cwd, selection.since_ms)
                for named in (
                    [] if found else named_output_dirs(conn, [r for r, _ in selection.run_ids(conn)], cwd)
                ):
                    found = find_user_logdir(named, selection.since_ms)
                    if found is not None:
                        break
                if found is not None:
                    root = found
                    say(
                        f"gpuwatch: TensorBoard figures beside the program's own logs, in {root / 'gpuwatch'}"
                    )
                elif watched_gone or _over(conn, selection):
                    root = cwd / "runs"
                    say(
                        f"gpuwatch: the program wrote no TensorBoard logs under {cwd}; "
                        f"its figures went to {root / 'gpuwatch'}"
                    )
            runs = selection.run_ids(conn)
            if root is not None:
                for run_id, status in runs:
                    mirror = mirrors.get(run_id)
                    if mirror is None:
                        mirror = mirrors[run_id] = RunMirror(run_id, run_dir(root, queries.run(conn, run_id)))
                    if status != "running" or watched_gone:
                        mirror.close(conn)
                    else:
                        mirror.update(conn)
            done = (
                root is not None
                and (watched_gone or _over(conn, selection))
                and all(m.closed for m in mirrors.values())
            )
        if done:
            return [m.directory for m in mirrors.values()]
        time.sleep(poll_s)


def _over(conn: sqlite3.Connection, selection: Selection) -> bool:
    """The wrapper's run has ended; or the process is gone and none of its runs still runs."""
    if selection.wrapper_run_id:
        row = conn.execute("SELECT status FROM runs WHERE run_id = ?", (selection.wrapper_run_id,)).fetchone()
        return row is not None and row[0] != "running"
    return not _alive(selection.pid) and all(s != "running" for _, s in selection.run_ids(conn))

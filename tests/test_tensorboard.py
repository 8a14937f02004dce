"""gpuwatch's figures in TensorBoard: `gpuwatch export --format tensorboard` and the live mirror of
`gpuwatch run --tensorboard`, read back with TensorBoard's own reader (EventAccumulator) and
compared with the database; `--tensorboard auto` beside a real HF and a real Lightning Trainer."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from systools import wait_for

from gpuwatch.analysis.tensorboard import GPU_SERIES, STEP_SERIES
from gpuwatch.base import paths

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

PY = sys.executable
GPUWATCH = str(Path(PY).with_name("gpuwatch"))
TESTS = Path(__file__).parent
SCRIPTS = TESTS / "autorun_scripts"


def fake_gpus_env(tmp_path: Path) -> dict:
    """Two simulated GPUs (with GPM), sampled twice a second by `gpuwatch run`'s wrapper; the run's
    CUDA_VISIBLE_DEVICES names both, and its script puts itself on both (so it draws energy)."""
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(TESTS / "fake_driver"), os.environ.get("PYTHONPATH", "")]),
        FAKE_NVML_GPUS="2",
        FAKE_NVML_GPM="1",
        FAKE_NVML_PIDS_FILE=str(tmp_path / "pids"),
        GPUWATCH_INTERVAL="0.5",
        GPUWATCH_PROCESS_INTERVAL="0.5",
        CUDA_VISIBLE_DEVICES="0,1",
    )


def read_back(directory: Path) -> EventAccumulator:
    events = EventAccumulator(str(directory), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    return events


def scalars(events: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in events.Scalars(tag)]


def text(events: EventAccumulator, tag: str) -> str:
    return events.Tensors(tag)[-1].tensor_proto.string_val[0].decode()


def db() -> sqlite3.Connection:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    conn.row_factory = sqlite3.Row
    return conn


def the_run(conn, name: str) -> sqlite3.Row:
    (run,) = conn.execute("SELECT * FROM runs WHERE name = ?", (name,)).fetchall()
    return run


def assert_steps_match(events: EventAccumulator, conn, run_id: str) -> int:
    """Every per-step series equals the database's steps: same steps, same values (float32)."""
    rows = conn.execute("SELECT * FROM steps WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()
    assert rows
    compared = 0
    for column, tag, scale in STEP_SERIES:
        want = [(r["step"], r[column] * scale) for r in rows if r[column] is not None]
        if not want:
            assert f"gpuwatch/step/{tag}" not in events.Tags()["scalars"]
            continue
        got = scalars(events, f"gpuwatch/step/{tag}")
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), tag
        compared += 1
    return compared


def assert_gpus_match(events: EventAccumulator, conn, run) -> None:
    """Each GPU's series over the run's lifetime equals its samples; throttle reasons as 0/1."""
    for gpu in (0, 1):
        rows = conn.execute(
            "SELECT * FROM gpu_samples WHERE gpu_index = ? AND ts_ms >= ? AND ts_ms <= ? ORDER BY ts_ms",
            (gpu, run["started_ms"], run["ended_ms"]),
        ).fetchall()
        assert len(rows) >= 3, f"GPU {gpu} was sampled while the run ran"
        for column, tag, scale in GPU_SERIES:
            got = scalars(events, f"gpuwatch/gpu{gpu}/{tag}")
            assert [v for _, v in got] == pytest.approx([r[column] * scale for r in rows], rel=1e-6), tag
            assert [s for s, _ in got] == [(r["ts_ms"] - run["started_ms"]) // 1000 for r in rows]
        power_cap = [v for _, v in scalars(events, f"gpuwatch/gpu{gpu}/throttle/power_cap")]
        assert power_cap == [1.0 if r["throttle_reasons"] & 0x4 else 0.0 for r in rows]
        sm = conn.execute(
            "SELECT sm_active_pct FROM gpu_prof_samples WHERE gpu_index = ? AND ts_ms >= ? "
            "AND ts_ms <= ? ORDER BY ts_ms",
            (gpu, run["started_ms"], run["ended_ms"]),
        ).fetchall()
        assert sm, "GPM gave SM activity"
        assert [v for _, v in scalars(events, f"gpuwatch/gpu{gpu}/sm_active_pct")] == pytest.approx(
            [r[0] for r in sm], rel=1e-6
        )


def hparams_of(events: EventAccumulator) -> dict:
    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}


@pytest.mark.slow
def test_a_finished_run_exports_every_figure_as_the_database_holds_it(tmp_path):
    done = subprocess.run(
        [GPUWATCH, "run", "--name", "tb-steps", "--", PY, str(SCRIPTS / "tb_steps.py"), "10", "0.25"],
        capture_output=True,
        text=True,
        timeout=180,
        env=fake_gpus_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    with db() as conn:
        run = the_run(conn, "tb-steps")
        # Two optimisers' losses, as the zero-code hooks store them for a GAN.
        conn.execute(
            "UPDATE steps SET losses_json = json_object('netD', step * 0.5, 'netG', step * 0.25) "
            "WHERE run_id = ?",
            (run["run_id"],),
        )
    out = subprocess.run(
        [GPUWATCH, "export", "tb-steps", "--format", "tensorboard", str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (directory,) = (tmp_path / "logs" / "gpuwatch").iterdir()
    assert directory.name == f"tb-steps-{run['run_id'][:8]}"
    assert f"wrote {directory.relative_to(tmp_path)}" in out.stderr.replace(str(tmp_path) + "/", "")
    events = read_back(directory)
    with db() as conn:
        assert assert_steps_match(events, conn, run["run_id"]) >= 4  # tokens/s, step time, loss, RSS
        assert scalars(events, "gpuwatch/step/loss/netD") == [
            (s, pytest.approx(s * 0.5)) for s in range(1, 11)
        ]
        assert scalars(events, "gpuwatch/step/loss/netG") == [
            (s, pytest.approx(s * 0.25)) for s in range(1, 11)
        ]
        assert_gpus_match(events, conn, run)
        tokens = conn.execute("SELECT sum(tokens) FROM steps WHERE run_id = ?", (run["run_id"],)).fetchone()[
            0
        ]
    assert tokens == 1280
    (energy,) = scalars(events, "gpuwatch/run/energy_kwh")
    assert energy[0] == 10 and energy[1] > 0
    (per_token,) = scalars(events, "gpuwatch/run/joules_per_token")
    assert per_token[1] == pytest.approx(energy[1] * 3.6e6 / 1280, rel=1e-5)
    summary = text(events, "gpuwatch/run/summary")
    assert "finished" in summary and run["run_id"] in summary
    hparams = hparams_of(events)
    assert (hparams["lr"], hparams["model.width"], hparams["name"]) == (0.1, 16.0, "tb-steps")
    assert "tb_steps.py" in hparams["command"]
    # A second export replaces the first's files instead of adding a copy of every point.
    again = subprocess.run(
        [GPUWATCH, "export", run["run_id"], "--format", "tensorboard", "-o", str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert len(list(directory.glob("events.out.tfevents.*"))) == 1
    assert len(scalars(read_back(directory), "gpuwatch/step/loss")) == 10


def test_an_oom_postmortem_is_exported_as_text(tmp_path):
    import resource

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    done = subprocess.run(
        [GPUWATCH, "run", "--name", "tb-oom", "--", PY, str(SCRIPTS / "oom.py")],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=limit_memory,
    )
    assert done.returncode != 0
    out = subprocess.run(
        [GPUWATCH, "export", "tb-oom", "--format", "tensorboard", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (directory,) = (tmp_path / "gpuwatch").iterdir()
    postmortem = text(read_back(directory), "gpuwatch/run/oom_postmortem")
    shown = subprocess.run([GPUWATCH, "oom", "tb-oom"], capture_output=True, text=True, timeout=60).stdout
    # The same text `gpuwatch oom` prints, kept as a preformatted block.
    assert [line.removeprefix("    ") for line in postmortem.splitlines()] == shown.rstrip("\n").splitlines()
    assert "requested 16.0 GiB" in postmortem


@pytest.mark.slow(15)
def test_the_live_mirror_grows_while_the_run_runs_and_ends_with_it(tmp_path):
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [
            GPUWATCH,
            "run",
            "--name",
            "tb-steps",
            "--tensorboard",
            str(logs),
            "--",
            PY,
            str(SCRIPTS / "tb_steps.py"),
            "40",
            "0.25",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fake_gpus_env(tmp_path),
    )
    try:

        def steps_seen() -> int:
            found = list((logs / "gpuwatch").glob("*/events.out.tfevents.*"))
            if not found:
                return 0
            events = read_back(found[0].parent)
            return (
                len(events.Scalars("gpuwatch/step/loss"))
                if "gpuwatch/step/loss" in events.Tags()["scalars"]
                else 0
            )

        first = wait_for(lambda: steps_seen() >= 3, timeout=90) and steps_seen()
        assert proc.poll() is None, "the run is still going"
        wait_for(lambda: steps_seen() >= first + 5, timeout=60)
        assert proc.poll() is None
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    (directory,) = (logs / "gpuwatch").iterdir()
    events = read_back(directory)
    with db() as conn:
        run = the_run(conn, "tb-steps")
        assert directory.name == f"tb-steps-{run['run_id'][:8]}"
        assert assert_steps_match(events, conn, run["run_id"]) >= 4
        assert len(scalars(events, "gpuwatch/step/loss")) == 40
        assert_gpus_match(events, conn, run)
    assert "finished" in text(events, "gpuwatch/run/summary")


def assert_beside_the_trainers_own_logs(root: Path, pattern: str, stderr: str, run_id: str) -> None:
    """`gpuwatch run --tensorboard auto` over a real trainer that writes its own TensorBoard logs
    (`pattern`, under `root`): ours went beside them, in a `gpuwatch` directory of their own, hold
    the run's steps, and theirs are untouched. The trainer tests of test_autoinstrument.py call
    this on their own run: one trainer process checks both."""
    (theirs,) = {p.parent for p in root.glob(pattern) if "gpuwatch" not in p.parts}
    (ours,) = (theirs / "gpuwatch").iterdir()
    assert f"beside the program's own logs, in {theirs / 'gpuwatch'}" in stderr
    events = read_back(ours)
    with db() as conn:
        assert assert_steps_match(events, conn, run_id) >= 2
    assert [s for s, _ in scalars(events, "gpuwatch/step/loss")] == list(range(1, 13))
    # The trainer's own curves are untouched, in their own directory.
    assert any(tag.startswith(("train", "loss", "epoch")) for tag in read_back(theirs).Tags()["scalars"])


def test_autolog_mirrors_a_notebook_style_process(tmp_path):
    logs = tmp_path / "tb"
    done = subprocess.run(
        [PY, str(SCRIPTS / "tb_steps.py"), "6", "0.1", "--autolog", str(logs)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    directory = wait_for(lambda: next((logs / "gpuwatch").glob("tb-autolog-*"), None), timeout=60)
    events = wait_for(
        lambda: (e := read_back(directory)) and "gpuwatch/run/summary" in e.Tags()["tensors"] and e,
        timeout=60,
    )
    with db() as conn:
        run = the_run(conn, "tb-autolog")
        assert assert_steps_match(events, conn, run["run_id"]) >= 3
    assert len(scalars(events, "gpuwatch/step/loss")) == 6


def test_a_generation_run_exports_its_latencies(tmp_path):
    done = subprocess.run(
        [
            PY,
            "-m",
            "workloads.kv_generate",
            "--tiny",
            "--prompt-len",
            "16",
            "--new-tokens",
            "4",
            "--name",
            "tb-decode",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=TESTS.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = subprocess.run(
        [GPUWATCH, "export", "tb-decode", "--format", "tensorboard", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (directory,) = (tmp_path / "gpuwatch").iterdir()
    events = read_back(directory)
    with db() as conn:
        run = the_run(conn, "tb-decode")
        rows = conn.execute(
            "SELECT gen_id, ttft_ms, tokens_per_s FROM generations WHERE run_id = ? ORDER BY gen_id",
            (run["run_id"],),
        ).fetchall()
    assert rows
    assert scalars(events, "gpuwatch/generation/ttft_ms") == [
        (r[0], pytest.approx(r[1], rel=1e-6)) for r in rows
    ]
    assert scalars(events, "gpuwatch/generation/tokens_per_s") == [
        (r[0], pytest.approx(r[2], rel=1e-6)) for r in rows
    ]


def test_bad_requests_get_one_line_errors(tmp_path):
    assert subprocess.run([GPUWATCH, "run", "--", "true"], timeout=60).returncode == 0  # a database
    unknown = subprocess.run(
        [GPUWATCH, "export", "no-such-run", "--format", "tensorboard", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        unknown.returncode != 0 and unknown.stderr.startswith("Error: ") and "no-such-run" in unknown.stderr
    )
    assert len(unknown.stderr.strip().splitlines()) == 1
    follow = subprocess.run(
        [GPUWATCH, "export", "x", "--format", "csv", "--follow"], capture_output=True, text=True, timeout=60
    )
    assert follow.returncode == 2 and "--follow needs --format tensorboard" in follow.stderr
    assert not (tmp_path / "gpuwatch").exists()


def test_nothing_of_tensorboard_is_imported_unless_asked():
    probe = (
        "import sys, gpuwatch.cli.analysis_cmd, gpuwatch.cli.run_cmd, gpuwatch.client.supervise, "
        "gpuwatch.integrations.autolog; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorboard', 'tensorflow'))))"
    )
    out = subprocess.run([PY, "-c", "import json; " + probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == []


def test_auto_looks_under_an_output_dir_the_runs_config_names_outside_the_working_directory(tmp_path):
    import gpuwatch
    from gpuwatch.analysis.tensorboard import named_output_dirs

    here = tmp_path / "here"
    named = {
        "outside": {"training_args": {"output_dir": str(tmp_path / "scratch" / "exp1")}},
        "relative": {"training_args": {"output_dir": "out"}},  # under the working directory: walked anyway
        "up": {"training_args": {"output_dir": "../up"}},
        "odd": {"training_args": ["not", "a", "mapping"]},
    }
    ids = []
    for name, config in named.items():
        with gpuwatch.track(name=name, config=config) as run:
            ids.append(run.run_id)
    with db() as conn:
        assert sorted(named_output_dirs(conn, ids, here)) == [tmp_path / "scratch" / "exp1", tmp_path / "up"]
        assert named_output_dirs(conn, [], here) == []

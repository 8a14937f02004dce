"""`gpuwatch run` gets every loop shape's numbers right: a GAN's two optimisers (one step per
iteration, each one's loss), an LBFGS closure (its first evaluation), data wait measured inside
the data loader apart from evaluation and checkpoints, named torchrun ranks, our stderr lines."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from test_autoinstrument import GPUWATCH, PY, SCRIPTS, gw_run, plain, query, steps_of, the_run

pytest.importorskip("torch")


class Gan:
    """One `gpuwatch run` of gan.py (a torch process and its wrapper), which three tests read."""

    def __init__(self, done: subprocess.CompletedProcess, env: dict, db: Path):
        self.done, self.env, self.db = done, env, db

    def query(self, sql: str, *params) -> list[sqlite3.Row]:
        conn = sqlite3.connect(self.db)
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def run(self) -> sqlite3.Row:
        (run,) = self.query("SELECT * FROM runs WHERE parent_run_id IS NULL")
        return run


@pytest.fixture(scope="module")
def gan(tmp_path_factory):
    """Its own private dirs, as conftest's isolated_env gives each test (which runs after this)."""
    home = tmp_path_factory.mktemp("gan")
    runtime = Path(f"/tmp/gw-rt-gan-{os.getpid()}")  # short: Unix socket paths are at most 107 bytes
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env.update(
        XDG_RUNTIME_DIR=str(runtime),
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        GPUWATCH_CONFIG=str(home / "config" / "gpuwatch.toml"),
    )
    done = gw_run(PY, str(SCRIPTS / "gan.py"), env=env)
    (db,) = (home / "data").rglob("*.db")
    yield Gan(done, env, db)
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.slow
def test_a_gan_records_one_step_per_iteration_with_each_optimisers_loss_named_after_its_module(gan):
    done = gan.done
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [
        tuple(map(float, re.findall(r"Loss_[DG]: (\S+)", line)))
        for line in done.stdout.splitlines()
        if line.startswith("[")
    ]
    steps = gan.query("SELECT * FROM steps WHERE run_id = ? ORDER BY step", gan.run()["run_id"])
    assert [s["step"] for s in steps] == list(range(1, len(printed) + 1))  # steps = iterations
    for step, (loss_d, loss_g) in zip(steps, printed):  # step k carries iteration k's losses
        losses = json.loads(step["losses_json"])
        assert list(losses) == ["netD", "netG"]
        assert (losses["netD"], losses["netG"]) == pytest.approx((loss_d, loss_g), rel=1e-5)
        assert step["loss"] == pytest.approx(loss_d, rel=1e-5)  # `loss`: the first optimiser's
    # Every other iteration ends with G's images under no_grad: the next step's evaluation time.
    assert all(s["eval_pct"] > 0 for s in steps[2::2]) and all(s["eval_pct"] == 0 for s in steps[1::2])
    # show prints each optimiser's loss by name.
    shown = subprocess.run(
        [GPUWATCH, "show", gan.run()["run_id"]], capture_output=True, text=True, timeout=60, env=gan.env
    )
    assert re.search(r"losses\s+netD .*netG", shown.stdout), shown.stdout


def test_the_run_of_a_gan_counts_the_parameters_of_both_modules(gan):
    import torch.nn as nn  # the script's two modules, built alike

    netG = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
    netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())
    assert gan.done.returncode == 0, gan.done.stderr[-3000:]
    (attached,) = gan.query(
        "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached'", gan.run()["run_id"]
    )
    config = json.loads(attached["payload_json"])["config"]
    assert config["n_params"] == sum(p.numel() for m in (netG, netD) for p in m.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("made", ["at-each-phase", "--up-front"])
def test_a_second_phases_optimiser_replacing_the_first_is_still_one_optimiser(made):
    """Head only, then an optimiser over the whole model (made then, or before the first phase):
    one step an iteration, one loss a step, no named ones."""
    done = gw_run(PY, str(SCRIPTS / "two_phases.py"), made)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("phase ")]
    steps = steps_of(the_run()["run_id"])
    assert [s["loss"] for s in steps] == [pytest.approx(loss, rel=1e-5) for loss in printed]
    assert [s["losses_json"] for s in steps] == [None] * 10


@pytest.mark.slow
@pytest.mark.parametrize("how", ["shared", "bare", "in-backward"])
def test_several_optimisers_after_one_backward_make_one_step_an_iteration_with_its_loss(how):
    """nanochat's AdamW and Muon over one model (no losses to name: one backward), SAC's
    temperature beside the model (no empty step of its own), an optimiser a parameter stepped
    inside backward() (each step its own iteration's loss, not the one before)."""
    done = gw_run(PY, str(SCRIPTS / "optimisers.py"), how)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    steps = steps_of(the_run()["run_id"])
    assert [(s["step"], s["tokens"]) for s in steps] == [(n, 64) for n in range(1, 7)]
    assert [s["loss"] for s in steps] == [pytest.approx(loss, rel=1e-5) for loss in printed]
    assert [s["losses_json"] for s in steps] == [None] * 6


@pytest.mark.slow
def test_a_lightning_gan_stepping_by_hand_gets_each_optimisers_loss():
    """Manual optimisation: training_step returns nothing; its backward()s are the losses."""
    pytest.importorskip("lightning")
    done = gw_run(PY, str(SCRIPTS / "lightning_shapes.py"), "manual-gan")
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [
        tuple(map(float, line.split()[3::2])) for line in done.stdout.splitlines() if line.startswith("step ")
    ]
    steps = steps_of(the_run()["run_id"])
    assert len(steps) == len(printed) == 6
    for step, (g, d) in zip(steps, printed):
        assert json.loads(step["losses_json"]) == {
            "generator": pytest.approx(g, rel=1e-5),
            "discriminator": pytest.approx(d, rel=1e-5),
        }
        assert step["loss"] == pytest.approx(g, rel=1e-5) and step["closure_evals"] is None


@pytest.mark.slow
def test_lightnings_shorter_last_accumulation_window_gets_its_micro_batches_mean():
    pytest.importorskip("lightning")
    done = gw_run(PY, str(SCRIPTS / "lightning_shapes.py"), "remainder")
    assert done.returncode == 0, done.stderr[-3000:]
    micro = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("micro ")]
    windows: dict = {}
    for epoch, batch, loss in micro:  # batches 0-3, then 4-5, each epoch
        windows.setdefault((epoch, int(batch) // 4), []).append(float(loss))
    steps = steps_of(the_run()["run_id"])
    assert [s["loss"] for s in steps] == [pytest.approx(sum(w) / len(w), rel=1e-5) for w in windows.values()]
    assert [len(w) for w in windows.values()] == [4, 2, 4, 2]


@pytest.mark.slow
def test_a_dqns_acting_forwards_with_gradients_on_leave_every_steps_loss():
    """The training forward after 2 acting ones (the 3rd since the backward) got no check of its
    own: its backward, through it, is the step's loss all the same (was none on such steps)."""
    done = gw_run(PY, str(SCRIPTS / "acting.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    steps = steps_of(the_run()["run_id"])
    assert [s["loss"] for s in steps] == [pytest.approx(loss, rel=1e-5) for loss in printed]
    assert len(steps) == 20


@pytest.mark.slow
def test_an_lbfgs_step_carries_the_closures_first_evaluation_and_the_evaluation_count():
    done = gw_run(PY, str(SCRIPTS / "lbfgs.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [
        (float(line.split()[3]), int(line.split()[5]))
        for line in done.stdout.splitlines()
        if line.startswith("step ")
    ]
    steps = steps_of(the_run()["run_id"])
    assert [(s["loss"], s["closure_evals"]) for s in steps] == [
        (pytest.approx(loss, rel=1e-5), evals) for loss, evals in printed
    ]
    assert printed[0][1] > 1  # LBFGS did evaluate its closure several times a step


@pytest.mark.slow
def test_a_timm_like_task_gets_its_loss_no_tokens_from_labels_and_only_the_trained_parameters():
    """Its loss changed in place before each backward (the step's: the roots, the mean of the
    micro-batches' losses as returned), its labels are not token ids, its EMA copy is not trained."""
    done = gw_run(PY, str(SCRIPTS / "timm_like.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    run = the_run()
    steps = steps_of(run["run_id"])
    assert [s["loss"] for s in steps] == [pytest.approx(x, rel=1e-5) for x in logged] and len(logged) == 6
    assert {(s["tokens"], s["samples"], s["seq_len"]) for s in steps} == {(None, None, None)}
    (attached,) = query(
        "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached'", run["run_id"]
    )
    config = json.loads(attached["payload_json"])["config"]
    assert config["n_params"] == int(done.stdout.split("params ")[-1]) and "seq_len" not in config


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["micro-batches"]], ids=["one batch a step", "micro-batches"])
def test_data_wait_is_the_time_inside_the_loader_and_evaluation_and_checkpoints_are_named(tmp_path, args):
    """micro-batches: the second batch of a step is fetched after its compute began (data, not
    compute), and a generation after the evaluation calls a part of the model. The first step
    begins as its first batch is asked for: that wait is its data too (it was in no step)."""
    done = gw_run(PY, str(SCRIPTS / "eval_checkpoint.py"), str(tmp_path / "ckpt.pt"), *args)
    assert done.returncode == 0, done.stderr[-3000:]
    in_loader = {
        int(line.split()[1]): float(line.split()[3])
        for line in done.stdout.splitlines()
        if line.startswith("step ")
    }
    steps = {s["step"]: s for s in steps_of(the_run()["run_id"])}
    assert len(steps) == 12 and set(in_loader) == set(range(1, 13))
    # Within 5 points of what the program measured in its loader, as a share of the same step:
    # where a step ends (inside optimizer.step, or after zero_grad as the program reads its
    # clock) moves a preempted ms between neighbouring steps on a busy host, not data wait.
    for n, ms in in_loader.items():
        pct = 100 * ms / steps[n]["step_time_ms"]
        assert abs(steps[n]["data_wait_pct"] - pct) <= 5, (n, dict(steps[n]), pct)
    # Steps 5 and 9 follow an epoch's evaluation pass and checkpoint: that time is named, not
    # data, nor left as "other" (the evaluation's forwards are a fifth of those steps).
    for n in (5, 9):
        s = steps[n]
        assert s["eval_pct"] > 20 and s["data_wait_pct"] + s["compute_pct"] + s["eval_pct"] > 90, dict(s)
    assert all(steps[n]["eval_pct"] < 5 for n in steps if n not in (5, 9))
    assert all(
        s["compute_pct"] > 5 and s["data_wait_pct"] + s["compute_pct"] + s["eval_pct"] <= 100.5
        for s in steps.values()
    )
    shown = subprocess.run(
        [GPUWATCH, "show", the_run()["run_id"]], capture_output=True, text=True, timeout=60
    )
    split = next(line for line in shown.stdout.splitlines() if line.strip().startswith("split"))
    assert all(word in split for word in ("data", "compute", "eval/checkpoint", "other")), split


@pytest.mark.slow
def test_our_stderr_lines_say_they_are_ours_and_there_is_at_most_one(gan):
    done = gan.done
    assert done.returncode == 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) <= 1 and all(line.startswith("gpuwatch: ") for line in lines), done.stderr
    plain = subprocess.run([PY, str(SCRIPTS / "gan.py")], capture_output=True, text=True, timeout=180)
    assert plain.stdout == done.stdout  # and nothing else changed for the program


@pytest.mark.slow
@pytest.mark.parametrize("how", ["gpuwatch run", "callback"])
def test_a_lightning_validation_loop_is_the_next_steps_evaluation_time(how):
    script = str(SCRIPTS / "lightning_validation.py")
    done = gw_run(PY, script) if how == "gpuwatch run" else plain(PY, script, "--callback")
    assert done.returncode == 0, done.stderr[-3000:]
    after = [int(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("validated")]
    assert after == [3, 6, 9]
    (run,) = query("SELECT * FROM runs WHERE parent_run_id IS NULL")
    steps = {s["step"]: s for s in steps_of(run["run_id"])}
    assert sorted(steps) == list(range(1, 10))
    # 0.3 s of validation after steps 3 and 6 (the last one follows the last step: no step has it)
    for n in (4, 7):
        assert steps[n]["eval_pct"] > 50, dict(steps[n])
    assert all(steps[n]["eval_pct"] == 0 for n in steps if n not in (4, 7))

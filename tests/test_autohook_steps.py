"""Every run has steps, and its loss, even when nothing in it is torch.optim or returns a loss."""

from __future__ import annotations

import subprocess

import pytest
from test_autoinstrument import GPUWATCH, PY, SCRIPTS, gw_run, steps_of, the_run

pytest.importorskip("torch")


def _logged_losses(stdout: str) -> list[float]:
    return [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("how", ["sgd", "scaler", "one-element"])
def test_hand_updates_and_a_loss_outside_forward_give_steps_and_the_unscaled_loss(how):
    done = gw_run(PY, str(SCRIPTS / "by_hand.py"), how)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    assert [(s["step"], s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [
        (n, 64, 4, 16) for n in range(1, 6)
    ]
    # The scalar backward() was called on; with GradScaler, divided by its scale (1024) again.
    assert [s["loss"] for s in steps] == pytest.approx(_logged_losses(done.stdout), rel=1e-5)


@pytest.mark.parametrize("body", ["transformer", "lstm"])
def test_sequence_first_inputs_count_samples_and_seq_len_the_right_way_round(body):
    done = gw_run(PY, str(SCRIPTS / "seq_first.py"), body)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])  # (16, 4) ids: 4 sequences of 16 tokens
    assert [(s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [(64, 4, 16)] * 3


@pytest.mark.slow
def test_an_oom_in_the_first_forward_of_a_hugging_face_model_gets_the_full_advice():
    """Eager attention at L=8192, batch 8, 8 heads (16 GiB of scores) under a 4 GiB address space:
    the inputs (given by keyword) and the model's config reach the postmortem."""
    import resource

    from test_autoinstrument import query

    limit = 4 << 30
    done = gw_run(
        PY,
        str(SCRIPTS / "hf_oom.py"),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    assert done.returncode == 1, done.stderr[-2000:]
    run = the_run()
    assert run["status"] == "oom"
    (pm,) = query("SELECT * FROM oom_postmortems WHERE run_id = ?", run["run_id"])
    assert (pm["phase"], pm["seq_len"], pm["batch"]) == ("forward", 8192, 8)
    shown = subprocess.run(
        [GPUWATCH, "oom", run["run_id"]], capture_output=True, text=True, timeout=60
    ).stdout
    assert (
        "B·H·L² score tensor at L=8192 (B=8, H=8, 4 bytes each)" in shown and "SDPA/FlashAttention" in shown
    )
    assert "L ≤ " in shown and "fits" in shown  # the L that fits
    assert "bf16 autocast" in shown and "batch 8 -> 4" in shown


def test_a_fabric_loop_goes_through_the_generic_hooks():
    """(The same script's accelerate loop: test_autohook_launchers.py, under `accelerate launch`,
    checks these numbers too.)"""
    done = gw_run(PY, str(SCRIPTS / "fabric_accelerate.py"), "fabric")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    assert [(s["step"], s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [
        (n, 64, 4, 16) for n in range(1, 5)
    ]
    assert [s["loss"] for s in steps] == pytest.approx(_logged_losses(done.stdout), rel=1e-5)


def test_a_loss_outside_forward_stays_right_when_the_loop_changes_its_backward_pattern():
    """After TRUSTED_AFTER clean iterations the check that a backward runs through the model is
    left off; an iteration that then backpropagates something else gets no loss, not a wrong one,
    and the following ones are checked again."""
    done = gw_run(PY, str(SCRIPTS / "loss_pattern_change.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    logged = _logged_losses(done.stdout)
    assert [s["tokens"] for s in steps] == [128] * 12 + [64] * 6
    assert [s["loss"] for s in steps[:12]] == pytest.approx(logged[:12], rel=1e-5)
    assert steps[12]["loss"] is None  # the auxiliary root came first: which one was the loss?
    assert [s["loss"] for s in steps[13:]] == pytest.approx(logged[13:], rel=1e-5)


def test_a_model_that_returns_its_loss_keeps_every_steps_loss_when_the_backward_pattern_changes():
    """Its backward roots are not needed (nor detached: the step's loss is the one returned), so
    the auxiliary backward of the last 6 iterations costs no step its loss."""
    done = gw_run(PY, str(SCRIPTS / "loss_pattern_change.py"), "returned")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    assert [s["tokens"] for s in steps] == [128] * 12 + [64] * 6
    assert [s["loss"] for s in steps] == pytest.approx(_logged_losses(done.stdout), rel=1e-5)


@pytest.mark.slow
def test_an_oom_in_the_first_forward_under_the_hugging_face_trainer_gets_the_full_advice(tmp_path):
    """The Trainer's callback owns the steps; the hooks still give the run the first training
    forward's batch, seq_len, heads and attention implementation before it runs out of memory."""
    import resource

    from test_autoinstrument import query

    limit = 4 << 30
    done = gw_run(
        PY,
        str(SCRIPTS / "hf_trainer_oom.py"),
        str(tmp_path / "out"),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
    )
    assert done.returncode == 1, done.stderr[-2000:]
    run = the_run()
    assert run["status"] == "oom"
    (pm,) = query("SELECT * FROM oom_postmortems WHERE run_id = ?", run["run_id"])
    assert (pm["seq_len"], pm["batch"]) == (8192, 8)
    shown = subprocess.run(
        [GPUWATCH, "oom", run["run_id"]], capture_output=True, text=True, timeout=60
    ).stdout
    assert (
        "B·H·L² score tensor at L=8192 (B=8, H=8, 4 bytes each)" in shown and "SDPA/FlashAttention" in shown
    )
    assert "L ≤ " in shown and "batch 8 -> 4" in shown


@pytest.mark.parametrize("how", ["all", "first-unused"])
def test_reinforce_many_forwards_a_step_give_one_step_an_episode_and_its_loss(how):
    """The autograd check sits on two forwards' outputs a backward, not on every one: the first
    since the last backward and the latest; either reaching the model is enough."""
    done = gw_run(PY, str(SCRIPTS / "reinforce_like.py"), how)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert [s["loss"] for s in steps] == pytest.approx(_logged_losses(done.stdout), rel=1e-5)

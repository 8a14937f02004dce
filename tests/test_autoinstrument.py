"""Zero-code runs: `gpuwatch run -- python script.py` on scripts that never import gpuwatch,
through the real CLI, real torch and the real Hugging Face Trainer (embedded database)."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from systools import NO_GPU_LINE
from test_profiling import _db_rows, daemon  # noqa: F401 — a real daemon for profile/stacks
from test_tensorboard import assert_beside_the_trainers_own_logs

from gpuwatch.base import paths

pytest.importorskip("torch")

PY = sys.executable
GPUWATCH = str(Path(PY).with_name("gpuwatch"))
SCRIPTS = Path(__file__).parent / "autorun_scripts"


def gw_run(
    *command: str,
    flags: tuple = (),
    env: dict | None = None,
    timeout: float = 180,
    preexec_fn=None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GPUWATCH, "run", *flags, "--", *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=preexec_fn,
        cwd=cwd,
    )


def plain(*command: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=180, env=env)


def query(sql: str, *params) -> list[sqlite3.Row]:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def the_run() -> sqlite3.Row:
    (run,) = query("SELECT * FROM runs WHERE parent_run_id IS NULL")
    return run


def steps_of(run_id: str) -> list[sqlite3.Row]:
    return query("SELECT * FROM steps WHERE run_id = ? ORDER BY step", run_id)


def users_sitecustomize(directory: Path) -> tuple[dict, Path]:
    """An environment whose PYTHONPATH holds a user's own sitecustomize, and the log it writes:
    each process it ran in, by its argv."""
    ran = directory / "ran.log"
    (directory / "sitecustomize.py").write_text(
        f'import sys\nMARK = "the user\'s own"\nopen({str(ran)!r}, "a").write(" ".join(sys.argv) + "\\n")\n'
    )
    return dict(os.environ, PYTHONPATH=str(directory)), ran


def test_a_hand_written_loop_with_grad_accumulation_two_optimisers_and_eval(tmp_path):
    env, ran = users_sitecustomize(tmp_path)  # which still runs in the script (ours runs it)
    done = gw_run(PY, str(SCRIPTS / "loop.py"), env=env)
    assert done.returncode == 0, done.stderr
    # Of ours on stderr, only the one line that this host has no GPU to sample.
    assert "trained 5 steps" in done.stdout and "gpuwatch:" not in done.stderr.replace(NO_GPU_LINE, "")
    assert str(SCRIPTS / "loop.py") in ran.read_text().splitlines()  # the child: its argv is the script
    run = the_run()
    assert run["status"] == "finished"
    steps = steps_of(run["run_id"])
    # One step per iteration (two optimisers step in each), 4 micro-batches of 4 x 16 tokens each;
    # the eval forwards (8 x 16 under no_grad) and the loss module's integer targets not counted.
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert {(s["tokens"], s["samples"], s["seq_len"]) for s in steps} == {(4 * 4 * 16, 16, 16)}
    assert all(s["step_time_ms"] > 0 and s["tokens_per_s"] > 0 and s["rss_bytes"] > 0 for s in steps)
    # The model returns logits: the loss is what backward() was called on (loss / 4, summed).
    logged = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("step ")]
    assert [s["loss"] for s in steps] == pytest.approx(logged, rel=1e-5)
    # The hooks' config is the run's own (its column was empty: the wrapper starts the run and the
    # child only attaches), so plain SQL reads it: 32*64 + 3*(32*32 + 32) + 32*64 + 64 parameters.
    ((n_params, batch, seq_len),) = query(
        "SELECT json_extract(config_json, '$.n_params'), json_extract(config_json, '$.batch'), "
        "json_extract(config_json, '$.seq_len') FROM runs WHERE run_id = ?",
        run["run_id"],
    )
    assert (n_params, batch, seq_len) == (64 * 32 + 3 * (32 * 32 + 32) + 32 * 64 + 64, 4, 16)


@pytest.mark.slow
def test_generate_with_an_encoder_decoder_model_counts_the_new_tokens_of_its_decoder():
    """T5 returns the decoder's sequence (a start token and 4 new ones a row), shorter than its
    12-token prompts (3 of them padding): 2 x 4 new tokens, not a negative count refused with a
    line on stderr; 21 prompt tokens."""
    pytest.importorskip("transformers")
    done = gw_run(PY, str(SCRIPTS / "hf_seq2seq_generate.py"))
    assert done.returncode == 0 and "generated (2, 5)" in done.stdout, done.stderr[-3000:]
    (gen,) = query("SELECT * FROM generations WHERE run_id = ?", the_run()["run_id"])
    assert (gen["prompt_tokens"], gen["new_tokens"]) == (21, 8)
    assert len([line for line in done.stderr.splitlines() if line.startswith("gpuwatch:")]) <= 1, done.stderr


@pytest.mark.slow
def test_the_real_hugging_face_trainer_unchanged_with_our_tensorboard_logs_beside_its_own(tmp_path):
    # Its output_dir is not under the working directory: `auto` finds its logs from its config.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = gw_run(
        PY,
        str(SCRIPTS / "hf_trainer.py"),
        str(tmp_path / "out"),
        "--pad",
        "--tensorboard",
        flags=("--tensorboard", "auto"),
        cwd=elsewhere,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("GPUWATCH_TEST "))
    trainer = json.loads(line.removeprefix("GPUWATCH_TEST "))
    logs = [entry for entry in trainer["logged"] if "loss" in entry]
    # The bootstrap added our callback (once); the generic hooks stood aside: one step per step.
    assert trainer["callbacks"].count("gpuwatch.integrations.hf") == 1
    run = the_run()
    steps = steps_of(run["run_id"])
    assert run["status"] == "finished"
    assert [s["step"] for s in steps] == [entry["step"] for entry in logs] == list(range(1, 13))
    # Tokens: the unmasked ones, as the Trainer's own non-padding count has them (8 x 28 a step).
    seen = [0] + [entry["num_input_tokens_seen"] for entry in logs]
    assert [s["tokens"] for s in steps] == [b - a for a, b in zip(seen, seen[1:])] == [8 * 28] * 12
    assert {(s["samples"], s["seq_len"]) for s in steps} == {(8, 32)}
    # The loss the Trainer logged at each step (mean over its 2 accumulated micro-batches).
    for step, entry in zip(steps, logs):
        assert step["loss"] == pytest.approx(entry["loss"], rel=1e-5)
    # Throughput over the same steps (2..12): the Trainer's cumulative figures vs our step times.
    first, last = logs[0], logs[-1]
    theirs = (last["num_input_tokens_seen"] - first["num_input_tokens_seen"]) / (
        last["train_runtime"] - first["train_runtime"]
    )
    ours = sum(s["tokens"] for s in steps[1:]) / (sum(s["step_time_ms"] for s in steps[1:]) / 1000)
    # (0.998-1.000 on a quiet machine; CI's 4 test workers on 2 cores can hold up one side's
    # boundary: one such pause read 0.946)
    assert ours == pytest.approx(theirs, rel=0.08)
    # generate() after training: one generation, 4 prompt tokens, 5 new ones.
    (gen,) = query("SELECT * FROM generations WHERE run_id = ?", run["run_id"])
    assert (gen["prompt_tokens"], gen["new_tokens"]) == (4, trainer["generated"]) == (4, 5)
    assert gen["tokens_per_s"] > 0
    config = json.loads(
        query("SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached'", run["run_id"])[0][
            0
        ]
    )["config"]
    # The callback's config: the TrainingArguments and the model's config.
    assert config["model"]["n_layer"] == 2 and config["model"]["model_type"] == "gpt2"
    assert config["training_args"]["gradient_accumulation_steps"] == 2
    # Its TensorBoard logs, and ours beside them (`--tensorboard auto`).
    assert_beside_the_trainers_own_logs(
        tmp_path, "out/runs/*/events.out.tfevents.*", done.stderr, run["run_id"]
    )


@pytest.mark.slow
def test_a_trainers_own_loss_over_two_trainings_and_its_run_counts_the_trained_parameters(tmp_path):
    """compute_loss_func (as TRL's SFT and DPO losses, a subclass's compute_loss): the loss the
    Trainer trains on and logs, which the model's output does not hold. Both train() calls join
    the wrapper's one run: the second's steps number on (they were dropped, numbered from 1 again
    into steps the run already had)."""
    done = gw_run(PY, str(SCRIPTS / "hf_trainer.py"), str(tmp_path / "out"), "--loss-func", "--twice")
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("GPUWATCH_TEST "))
    second = [entry for entry in json.loads(line.removeprefix("GPUWATCH_TEST "))["logged"] if "loss" in entry]
    run = the_run()
    steps = steps_of(run["run_id"])
    assert [s["step"] for s in steps] == list(range(1, 25))
    assert [s["loss"] for s in steps[12:]] == [pytest.approx(entry["loss"], rel=1e-4) for entry in second]
    # (the callback's config: generate() after training attaches the hooks' own too)
    configs = [
        c
        for (payload,) in query(
            "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached'", run["run_id"]
        )
        if "training_args" in (c := json.loads(payload)["config"] or {})
    ]
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    assert [c["n_params"] for c in configs] == [sum(p.numel() for p in model.parameters())] * 2


@pytest.mark.slow
def test_a_trainer_calling_its_model_inside_a_loss_module_gets_tokens_compute_and_checkpoints(tmp_path):
    """sentence-transformers' losses call the model inside a module: its tokens and compute are
    the model's all the same; a no-grad pass inside the step (KTO's) is compute, not evaluation;
    the Trainer's checkpoints (safetensors, not torch.save) are checkpoint time; resumed from one,
    its steps are numbered as its log."""
    done = gw_run(PY, str(SCRIPTS / "hf_trainer.py"), str(tmp_path / "out"), "--loss-module")
    assert done.returncode == 0, done.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    assert [(s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [(8 * 32, 8, 32)] * 12
    assert all(s["compute_pct"] > 0 for s in steps)
    after_checkpoints = [s["step"] for s in steps if s["eval_pct"] > 0]
    assert after_checkpoints == [5, 9], [(s["step"], s["eval_pct"]) for s in steps]
    # (the first checkpoint writes its files anew, ~70 ms against a step's few: the step is most of it)
    assert steps[4]["eval_pct"] > 30, steps[4]["eval_pct"]
    # Resumed from its step 4 checkpoint, its steps are numbered as its own log (were from 1).
    for later in ("checkpoint-8", "checkpoint-12"):
        shutil.rmtree(tmp_path / "out" / later)
    done = gw_run(PY, str(SCRIPTS / "hf_trainer.py"), str(tmp_path / "out"), "--loss-module", "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("GPUWATCH_TEST "))
    logs = [entry for entry in json.loads(line.removeprefix("GPUWATCH_TEST "))["logged"] if "loss" in entry]
    resumed = query("SELECT * FROM runs WHERE parent_run_id IS NULL ORDER BY started_ms")[-1]
    steps = steps_of(resumed["run_id"])
    assert [s["step"] for s in steps] == [entry["step"] for entry in logs][-8:] == list(range(5, 13))
    assert [s["loss"] for s in steps] == [pytest.approx(entry["loss"], rel=1e-5) for entry in logs][-8:]


def test_a_script_that_tracks_itself_is_counted_once_by_its_own_calls():
    done = gw_run(PY, str(SCRIPTS / "own_track.py"))
    assert done.returncode == 0, done.stderr
    steps = steps_of(the_run()["run_id"])
    assert [(s["step"], s["tokens"], s["samples"]) for s in steps] == [(1, 100, 4), (2, 100, 4), (3, 100, 4)]


@pytest.mark.slow
def test_no_instrument_flag_and_variable_leave_the_program_alone():
    script = (PY, str(SCRIPTS / "by_hand.py"), "sgd")  # trains 5 steps by hand (no torch.optim: quick)
    assert gw_run(*script, flags=("--no-instrument",)).returncode == 0
    assert gw_run(*script, env=dict(os.environ, GPUWATCH_INSTRUMENT="0")).returncode == 0
    assert len(query("SELECT * FROM runs")) == 2 and query("SELECT * FROM steps") == []


def test_a_program_without_torch_and_the_users_own_sitecustomize_run_as_without_gpuwatch(tmp_path):
    """(With torch, the hand-written loop's test above checks the user's sitecustomize too.)"""
    env, _ = users_sitecustomize(tmp_path)
    script = [PY, str(SCRIPTS / "no_torch.py"), "a", "b"]
    wrapped, bare = gw_run(*script, env=env), plain(*script, env=env)
    assert (wrapped.returncode, wrapped.stdout) == (bare.returncode, bare.stdout)
    # stderr: the child's own, beside the wrapper's one line about sampling no GPUs here.
    assert bare.stderr in wrapped.stderr and "Traceback" not in wrapped.stderr
    assert wrapped.returncode == 3 and "hooks seen: False" in wrapped.stdout
    assert "sitecustomize: the user's own" in wrapped.stdout


@pytest.mark.slow
def test_a_failing_hook_switches_itself_off_with_one_line_and_the_program_runs_on():
    script = [PY, str(SCRIPTS / "hook_fault.py")]
    wrapped = gw_run(*script)
    bare = plain(*script, env=dict(os.environ, PYTHONPATH=""))  # the same script, no gpuwatch
    assert wrapped.returncode == bare.returncode == 0, wrapped.stderr
    assert wrapped.stdout == bare.stdout  # same training, same weights
    warnings = [
        line
        for line in wrapped.stderr.splitlines()
        if line.startswith("gpuwatch:") and not line.startswith(NO_GPU_LINE)
    ]
    assert len(warnings) == 1 and "simulated bug" in warnings[0] and "switched off" in warnings[0]
    assert the_run()["status"] == "finished"


def test_an_unmodified_script_that_runs_out_of_memory_gets_a_postmortem():
    """A real host OOM: naive attention scores of 4 x 4 x 16384² floats under a 4 GiB limit."""
    limit = 4 << 30
    done = gw_run(
        PY, str(SCRIPTS / "oom.py"), preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    )
    assert done.returncode == 1, done.stderr[-2000:]
    run = the_run()
    assert run["status"] == "oom"
    (pm,) = query("SELECT * FROM oom_postmortems WHERE run_id = ?", run["run_id"])
    assert pm["kind"] == "host" and pm["requested_bytes"] > 0 and pm["phase"] == "forward"


def _trainer_figures(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("GPUWATCH_TEST "))
    return json.loads(line.removeprefix("GPUWATCH_TEST "))


def _assert_lightning_run(steps, lightning: dict) -> None:
    """12 optimiser steps of 2 micro-batches of 4 x 32 tokens; the loss is the mean of each step's
    micro-batch losses; tokens/s over steps 2..12 agrees with Lightning's ThroughputMonitor."""
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert {(s["tokens"], s["samples"], s["seq_len"]) for s in steps} == {(256, 8, 32)}
    micro = lightning["micro_losses"]
    for step, pair in zip(steps, zip(micro[::2], micro[1::2])):
        assert step["loss"] == pytest.approx(sum(pair) / 2, rel=1e-5)
    monitor = [m for m in lightning["logged"] if "train/lengths" in m]
    theirs = (monitor[-1]["train/lengths"] - monitor[0]["train/lengths"]) / (
        monitor[-1]["train/time"] - monitor[0]["train/time"]
    )
    ours = sum(s["tokens"] for s in steps[1:]) / (sum(s["step_time_ms"] for s in steps[1:]) / 1000)
    assert ours == pytest.approx(theirs, rel=0.05)


@pytest.mark.slow
def test_the_real_lightning_trainer_unchanged_with_our_tensorboard_logs_beside_its_own(tmp_path):
    done = gw_run(
        PY,
        str(SCRIPTS / "lightning_trainer.py"),
        "--tensorboard",
        flags=("--tensorboard", "auto"),
        cwd=tmp_path,
    )
    lightning = _trainer_figures(done)
    assert lightning["callbacks"].count("gpuwatch.integrations.lightning") == 1  # added by the bootstrap
    run = the_run()
    assert run["status"] == "finished"
    _assert_lightning_run(steps_of(run["run_id"]), lightning)
    assert_beside_the_trainers_own_logs(
        tmp_path, "lightning_logs/version_*/events.out.tfevents.*", done.stderr, run["run_id"]
    )


@pytest.mark.slow
def test_the_lightning_callback_without_gpuwatch_run():
    lightning = _trainer_figures(plain(PY, str(SCRIPTS / "lightning_trainer.py"), "--callback"))
    (run,) = query("SELECT * FROM runs")
    assert (run["name"], run["status"]) == ("lightning-explicit", "finished")
    assert json.loads(run["config_json"])["d_model"] == 32  # the module's hyperparameters
    _assert_lightning_run(steps_of(run["run_id"]), lightning)
    # on_train_batch_start marks where each step's compute began: a data wait from step 2 on
    assert all(0 <= s["data_wait_pct"] <= 100 for s in steps_of(run["run_id"])[1:])


@pytest.mark.slow
def test_the_hugging_face_callback_without_gpuwatch_run(tmp_path):
    trainer = _trainer_figures(plain(PY, str(SCRIPTS / "hf_trainer.py"), str(tmp_path / "out"), "--callback"))
    logs = [entry for entry in trainer["logged"] if "loss" in entry]
    (run,) = query("SELECT * FROM runs")
    assert (run["name"], run["status"]) == ("hf-explicit", "finished")
    config = json.loads(run["config_json"])
    assert config["training_args"]["gradient_accumulation_steps"] == 2 and config["model"]["n_layer"] == 2
    steps = steps_of(run["run_id"])
    assert [s["step"] for s in steps] == [entry["step"] for entry in logs] == list(range(1, 13))
    assert {(s["tokens"], s["samples"], s["seq_len"]) for s in steps} == {(8 * 32, 8, 32)}
    for step, entry in zip(steps, logs):
        assert step["loss"] == pytest.approx(entry["loss"], rel=1e-5)
    assert all(0 <= s["data_wait_pct"] <= 100 for s in steps[1:])  # on_step_begin marks compute


@pytest.mark.slow
def test_an_unmodified_ddp_script_under_torchrun_is_one_job_of_two_ranks_named_after_it():
    torchrun = str(Path(PY).with_name("torchrun"))
    done = gw_run(
        torchrun, "--standalone", "--nproc_per_node=2", str(SCRIPTS / "ddp.py"), flags=("--name", "ddp2")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    wrapper = the_run()
    ranks = query("SELECT * FROM runs WHERE parent_run_id = ? ORDER BY rank", wrapper["run_id"])
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert ranks[0]["job_id"] and ranks[0]["job_id"] == ranks[1]["job_id"]
    assert {r["status"] for r in ranks} == {"finished"}
    assert [r["name"] for r in ranks] == ["ddp2/rank0", "ddp2/rank1"]
    # two ranks print at once: their lines may interleave, so the number ends at its last digit
    ages = {int(m[0]): float(m[1]) for m in re.findall(r"rank (\d) age_s (\d+\.\d+)", done.stdout)}
    for rank in ranks:  # the torchrun launcher imports torch too, but trains nothing: no run
        assert [(s["step"], s["tokens"]) for s in steps_of(rank["run_id"])] == [(1, 16), (2, 16), (3, 16)]
        # from the process's start to its end: at least its age when it printed it
        lived_ms = rank["ended_ms"] - rank["started_ms"]
        assert ages[rank["rank"]] * 1000 - 50 <= lived_ms <= ages[rank["rank"]] * 1000 + 5000, dict(rank)
    listed = subprocess.run([GPUWATCH, "runs"], capture_output=True, text=True, timeout=60).stdout
    assert "ddp2/rank0" in listed and "ddp2/rank1" in listed


@pytest.mark.skipif(os.geteuid() != 0, reason="the daemon fixture runs in system mode")
def test_profile_and_stacks_of_an_unmodified_live_run_through_the_daemon(daemon, tmp_path):  # noqa: F811 (the fixture)
    db, sock = daemon
    env = dict(os.environ, GPUWATCH_SOCKET=str(sock), GPUWATCH_RUNS_DIR=str(tmp_path / "runs"))
    wrapper = subprocess.Popen(
        [GPUWATCH, "run", "--name", "live", "--", PY, str(SCRIPTS / "live.py")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not _db_rows(db, "SELECT 1 FROM steps JOIN runs USING (run_id) WHERE name = 'live'"):
            assert wrapper.poll() is None, wrapper.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no steps reached the daemon"
            time.sleep(0.2)
        profile = subprocess.run(
            [GPUWATCH, "profile", "live", "--steps", "3", "--db", str(db), "--wait", "60"],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert profile.returncode == 0, profile.stderr
        assert "on_demand" in profile.stdout and "aten::embedding" in profile.stdout
        stacks = subprocess.run(
            [GPUWATCH, "stacks", "live", "--db", str(db)], env=env, capture_output=True, text=True, timeout=90
        )
        assert stacks.returncode == 0, stacks.stderr
        assert "live.py" in stacks.stdout and (
            "train_one_step" in stacks.stdout or "<module>" in stacks.stdout
        )
    finally:
        wrapper.terminate()
        wrapper.wait(30)


CUDA_LOOP = """
import torch
model = torch.nn.Sequential(torch.nn.Embedding(64, 256), torch.nn.Linear(256, 64)).cuda()
opt = torch.optim.AdamW(model.parameters())
class Wrapped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = model
    def forward(self, input_ids, attention_mask):
        return {"loss": self.inner(input_ids).float().pow(2).mean() * attention_mask.float().mean()}
wrapped = Wrapped()
for _ in range(4):
    ids = torch.randint(0, 64, (8, 128), device="cuda")
    mask = torch.ones_like(ids)
    mask[:, 100:] = 0
    wrapped(input_ids=ids, attention_mask=mask)["loss"].backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.gpu
def test_zero_code_on_a_real_gpu_counts_masked_tokens_on_the_device():
    """The mask's sum stays on the GPU until its step is resolved; steps get CUDA memory and time."""
    done = gw_run(PY, "-c", CUDA_LOOP)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = steps_of(the_run()["run_id"])
    assert [s["tokens"] for s in steps] == [8 * 100] * 4
    assert all(
        s["mem_allocated_bytes"] > 0 and s["step_time_ms"] > 0 and s["loss"] is not None for s in steps[1:]
    )

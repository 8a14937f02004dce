"""`gpuwatch run` is invisible to the program: the same output, files and exit status, copies and
pickles of its model work, and a model saved under gpuwatch loads where gpuwatch is absent."""

from __future__ import annotations

import os
import subprocess

import pytest
from test_autoinstrument import PY, SCRIPTS, gw_run, plain, steps_of, the_run

pytest.importorskip("torch")

LOAD_WITHOUT_GPUWATCH = """
import sys
sys.modules["gpuwatch"] = None  # any import of gpuwatch now fails
import torch
model = torch.load(sys.argv[1], weights_only=False)
print(type(model).__name__, sum(p.numel() for p in model.parameters()))
"""


@pytest.mark.slow
def test_copies_pickles_saves_script_trace_export_and_checkpoints_are_the_same(tmp_path):
    wrapped_dir, bare_dir = tmp_path / "wrapped", tmp_path / "bare"
    wrapped_dir.mkdir()
    bare_dir.mkdir()
    wrapped = gw_run(PY, str(SCRIPTS / "invisible.py"), str(wrapped_dir))
    bare = plain(PY, str(SCRIPTS / "invisible.py"), str(bare_dir), env=dict(os.environ, PYTHONPATH=""))
    assert wrapped.returncode == bare.returncode == 0, wrapped.stderr[-3000:]
    assert wrapped.stdout == bare.stdout
    assert "copies agree: [True, True, True, True]" in wrapped.stdout
    assert "hooks left on the model: []" in wrapped.stdout
    for name in ("ckpt.pt", "whole.pt"):  # byte-equal files
        assert (wrapped_dir / name).read_bytes() == (bare_dir / name).read_bytes(), name
    loaded = subprocess.run(
        [PY, "-c", LOAD_WITHOUT_GPUWATCH, str(wrapped_dir / "whole.pt")],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(SCRIPTS)),
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.startswith("TinyLM ")
    # gpuwatch's own lines: on stderr, each once; and the run saw the 4 steps.
    ours = [line for line in wrapped.stderr.splitlines() if "gpuwatch" in line or "GPUs" in line]
    assert len(ours) == len(set(ours)), ours
    assert [s["step"] for s in steps_of(the_run()["run_id"])] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["module", "inplace", "step", "optimizer"])
def test_torch_compile_compiles_as_often_and_warns_as_little_as_without_gpuwatch(how):
    """torch.compile(model), model.compile(), a training step compiled whole (the forward inside
    compiled code: steps and losses, no tokens) and a compiled optimiser step."""
    env = dict(os.environ, TORCH_LOGS="recompiles")
    wrapped = gw_run(PY, str(SCRIPTS / "compiled.py"), how, env=env)
    bare = plain(PY, str(SCRIPTS / "compiled.py"), how, env=dict(env, PYTHONPATH=""))
    assert wrapped.returncode == bare.returncode == 0, wrapped.stderr[-3000:]
    assert wrapped.stdout == bare.stdout  # the same losses and the same number of compilations
    assert "graphs compiled:" in wrapped.stdout
    recompiles = [line for line in wrapped.stderr.splitlines() if "Recompiling" in line]
    assert len(recompiles) == len([line for line in bare.stderr.splitlines() if "Recompiling" in line])
    assert "Warning" not in wrapped.stderr.replace(bare.stderr, ""), wrapped.stderr[-3000:]
    steps = steps_of(the_run()["run_id"])
    seen = (64, 4, 16) if how != "step" else (None, None, None)  # no forward of a module seen
    assert [(s["step"], s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [
        (n, *seen) for n in range(1, 7)
    ]
    logged = [float(line.split()[-1]) for line in wrapped.stdout.splitlines() if line.startswith("step ")]
    assert [s["loss"] for s in steps] == pytest.approx(logged, abs=1e-6)


@pytest.mark.slow
def test_a_forward_interrupted_by_ctrl_c_leaves_nothing_behind_once_training_goes_on():
    done = gw_run(PY, str(SCRIPTS / "interrupted.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "copied and pickled; hooks left: 0" in done.stdout
    # torch skips always-called hooks on a BaseException; the one-shot hook left on the model
    # ends its next forward instead, so every iteration is still seen, the interrupted one not.
    assert [(s["step"], s["tokens"]) for s in steps_of(the_run()["run_id"])] == [(n, 64) for n in range(1, 7)]

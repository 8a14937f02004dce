"""`gpuwatch run` hooks the training process however it is launched: `python -m pkg` and
`accelerate launch` (whose launcher imports torch too, but trains nothing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_autohook_steps import _logged_losses
from test_autoinstrument import PY, SCRIPTS, gw_run, query, steps_of, the_run

pytest.importorskip("torch")

TRAIN = """
import torch
from tiny_model import V, TinyLM, batch


def main(steps=3):
    gen = torch.Generator().manual_seed(0)
    model = TinyLM()
    for step in range(1, steps + 1):
        x = batch(gen)
        model.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
        loss.backward()
        with torch.no_grad():  # updated by hand: torch.optim's first use imports dynamo (~1 CPU-s a program)
            for p in model.parameters():
                p -= 1e-3 * p.grad
        print(f"step {step} loss {loss.item():.6f}")
"""


def _attached(run_id: str) -> list[dict]:
    """The processes that joined the run: one `attached` event each, with its own command."""
    return [
        json.loads(payload)
        for (payload,) in query(
            "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = 'attached'", run_id
        )
    ]


def test_python_dash_m_runs_a_package_and_its_steps_are_recorded(tmp_path, monkeypatch):
    package = tmp_path / "tinytrain"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(TRAIN)
    (package / "__main__.py").write_text("from .train import main\n\nmain()\n")
    monkeypatch.chdir(tmp_path)  # `python -m` finds the package in the working directory
    path = os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))  # tiny_model
    done = gw_run(PY, "-m", "tinytrain", env=dict(os.environ, PYTHONPATH=path))
    assert done.returncode == 0, done.stderr[-3000:]
    run = the_run()
    assert (run["name"], run["status"]) == ("tinytrain", "finished")
    steps = steps_of(run["run_id"])
    assert [(s["step"], s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [
        (n, 64, 4, 16) for n in range(1, 4)
    ]
    assert [s["loss"] for s in steps] == pytest.approx(_logged_losses(done.stdout), rel=1e-5)


@pytest.mark.slow
def test_accelerate_launch_records_the_script_and_not_its_launcher(tmp_path):
    accelerate = str(Path(PY).with_name("accelerate"))
    script = str(SCRIPTS / "fabric_accelerate.py")  # Accelerator(), prepare, accelerator.backward, step
    # accelerate reads its default config under HF_HOME: keep the user's out of the test.
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"))
    done = gw_run(accelerate, "launch", "--num_processes", "1", "--cpu", script, "accelerate", env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    run = the_run()
    assert run["status"] == "finished" and run["command"].split()[1:3] == ["launch", "--num_processes"]
    logged = _logged_losses(done.stdout)
    steps = steps_of(run["run_id"])
    assert len(logged) == 4
    assert [(s["step"], s["tokens"], s["samples"], s["seq_len"]) for s in steps] == [
        (n, 64, 4, 16) for n in range(1, 5)
    ]
    assert [s["loss"] for s in steps] == pytest.approx(logged, rel=1e-5)
    # The launcher imported torch as well but trained nothing: it joined no run, made none.
    assert len(query("SELECT * FROM runs")) == 1
    (joined,) = _attached(run["run_id"])
    assert joined["command"].split()[1:] == [script, "accelerate"]

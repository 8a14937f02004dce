"""gpuwatch.autolog() and `%load_ext gpuwatch` in a real Jupyter kernel (ipykernel, this venv's
Python, this checkout on its path): runs, their steps, and when each run ends."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import jupyter_client.manager as jupyter_client
import pytest

from gpuwatch.base import paths

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
TRAIN = """
import torch
model = torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))
def train(steps):
    for _ in range(steps):
        x = torch.randint(0, 32, (4, 8))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x).view(-1, 32), x.view(-1)).backward()
        with torch.no_grad():  # updated by hand: torch.optim's first use imports dynamo (~1 CPU-s a program)
            for p in model.parameters():
                p -= 0.1 * p.grad
"""


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A kernel of this interpreter, started from a kernelspec of our own; shut down politely
    (as closing a notebook does) at the end, so its exit ends the last run."""
    spec = tmp_path / "jupyter" / "kernels" / "gwtest"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "gpuwatch test",
                "language": "python",
                "env": {"PYTHONPATH": str(REPO)},
            }
        )
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    manager, client = jupyter_client.start_new_kernel(kernel_name="gwtest", startup_timeout=60)

    def run_cell(code: str) -> None:
        reply = client.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]

    yield run_cell, manager
    client.stop_channels()
    if manager.is_alive():
        manager.shutdown_kernel(now=True)


def _runs() -> list[tuple]:
    """(name, status, steps) of every run, oldest first."""
    conn = sqlite3.connect(paths.default_db_path(system=False))
    try:
        return conn.execute(
            "SELECT name, status, (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) "
            "FROM runs r ORDER BY started_ms"
        ).fetchall()
    finally:
        conn.close()


@pytest.mark.slow
def test_runs_in_a_notebook_end_at_a_new_autolog_after_idle_time_and_at_kernel_exit(kernel):
    run_cell, manager = kernel
    run_cell("%load_ext gpuwatch")
    run_cell(TRAIN + "train(5)")
    run_cell("import gpuwatch\ngpuwatch.autolog(name='second', idle_timeout=1.0)")
    assert _runs() == [("notebook", "finished", 5)]  # the second autolog() ended the first run

    run_cell("train(3)")
    run_cell("import time\ntime.sleep(2.5)")  # longer than idle_timeout: 'second' ends
    assert _runs()[1] == ("second", "finished", 3)
    run_cell("train(2)")  # the next step starts a new run of the same name

    manager.shutdown_kernel(now=False)  # what closing the notebook does: the kernel exits
    assert _runs() == [("notebook", "finished", 5), ("second", "finished", 3), ("second", "finished", 2)]

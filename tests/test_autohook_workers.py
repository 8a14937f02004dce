"""`gpuwatch run` on a program that trains in processes it starts itself (Hogwild workers,
torch.multiprocessing.spawn ranks): each one that trains is a run of its own in the job, with
exactly its own steps and losses; DataLoader workers, which call module transforms, are none."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from test_autohook_launchers import _attached
from test_autoinstrument import GPUWATCH, PY, SCRIPTS, gw_run, query, steps_of, the_run

pytest.importorskip("torch")
sys.path.insert(0, str(SCRIPTS))
from tiny_model import TinyLM  # noqa: E402

WORKERS = str(SCRIPTS / "workers.py")


def _logged(stdout: str, who: str) -> list[float]:
    """The losses the program printed for `who` ("worker1", "rank0", "main"), step by step."""
    return [float(line.split()[-1]) for line in stdout.splitlines() if line.startswith(f"{who} step ")]


def _run(name: str, *args: str):
    """workers.py with `args` under `gpuwatch run --name NAME`, which must succeed; its output
    and the wrapper's run."""
    done = gw_run(PY, WORKERS, *args, flags=("--name", name))
    assert done.returncode == 0, done.stderr[-3000:]
    return done, the_run()


def _job(wrapper_id: str) -> dict[str, dict]:
    """The runs of the wrapper's job by name."""
    return {r["name"]: dict(r) for r in query("SELECT * FROM runs WHERE parent_run_id = ?", wrapper_id)}


@pytest.mark.slow(6)
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_hogwild_workers_each_record_their_own_steps_and_losses(start):
    done, wrapper = _run("hog", f"hogwild-{start}")
    assert steps_of(wrapper["run_id"]) == []  # the program itself trains nothing
    job = _job(wrapper["run_id"])
    assert sorted(job) == ["hog/worker1", "hog/worker2"]
    for worker in ("worker1", "worker2"):
        run = job[f"hog/{worker}"]
        assert run["status"] == "finished"
        # its shape from its model's first forward, not from its loader's transform before it
        assert {k: json.loads(run["config_json"])[k] for k in ("batch", "seq_len")} == {
            "batch": 4,
            "seq_len": 16,
        }
        steps = steps_of(run["run_id"])
        assert [(s["step"], s["tokens"]) for s in steps] == [(n, 64) for n in range(1, 5)]
        assert [s["loss"] for s in steps] == pytest.approx(_logged(done.stdout, worker), rel=1e-5)
        # the time in its own loader (20 of ~50 ms), not the sleep after its step too
        assert all(15 < s["data_wait_pct"] < 60 for s in steps[1:]), [s["data_wait_pct"] for s in steps]
    shown = subprocess.run([GPUWATCH, "show", "hog"], capture_output=True, text=True, timeout=60).stdout
    assert "processes of this job" in shown and "hog/worker1" in shown and "hog/worker2" in shown


@pytest.mark.slow(5)
def test_workers_that_track_themselves_each_get_their_own_run():
    done, wrapper = _run("own", "tracked-spawn")
    job = _job(wrapper["run_id"])
    assert sorted(job) == ["own/worker1", "own/worker2"]
    for worker in ("worker1", "worker2"):
        steps = steps_of(job[f"own/{worker}"]["run_id"])
        assert [(s["step"], s["tokens"]) for s in steps] == [(1, 64), (2, 64), (3, 64)]
        assert [s["loss"] for s in steps] == pytest.approx(_logged(done.stdout, worker), rel=1e-5)


@pytest.mark.slow(4)
def test_a_worker_whose_target_raises_ends_its_run_failed_and_keeps_its_steps():
    done = gw_run(PY, WORKERS, "hogwild-fork", "fails", flags=("--name", "hog"))
    assert "RuntimeError: worker 2 gave up" in done.stderr  # multiprocessing prints the worker's error
    job = _job(the_run()["run_id"])
    failed, finished = job["hog/worker2"], job["hog/worker1"]
    assert (failed["status"], failed["error_type"]) == ("failed", "RuntimeError")
    assert [s["loss"] for s in steps_of(failed["run_id"])] == pytest.approx(_logged(done.stdout, "worker2"))
    assert finished["status"] == "finished" and len(steps_of(finished["run_id"])) == 4


@pytest.mark.slow(6)
def test_torch_multiprocessing_spawn_ranks_are_named_and_numbered_like_torchrun_ranks():
    with socket.socket() as s:  # a free port for the ranks' rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done, wrapper = _run("ddp", "ddp-spawn", str(port))
    job = _job(wrapper["run_id"])
    assert sorted(job) == ["ddp/rank0", "ddp/rank1"]
    assert [(job[f"ddp/rank{r}"]["rank"], job[f"ddp/rank{r}"]["world_size"]) for r in (0, 1)] == [
        (0, 2),
        (1, 2),
    ]
    assert job["ddp/rank0"]["job_id"] == job["ddp/rank1"]["job_id"] is not None
    for rank in (0, 1):
        steps = steps_of(job[f"ddp/rank{rank}"]["run_id"])
        assert [(s["step"], s["tokens"]) for s in steps] == [(1, 64), (2, 64), (3, 64)]
        assert [s["loss"] for s in steps] == pytest.approx(_logged(done.stdout, f"rank{rank}"), rel=1e-5)


@pytest.mark.slow(5)
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_dataloader_workers_that_call_module_transforms_leave_the_run_alone(start):
    done, wrapper = _run("loader", f"loader-{start}")
    assert _job(wrapper["run_id"]) == {}
    steps = steps_of(wrapper["run_id"])
    assert [(s["step"], s["tokens"]) for s in steps] == [(n, 64) for n in range(1, 5)]
    assert [s["loss"] for s in steps] == pytest.approx(_logged(done.stdout, "main"), rel=1e-5)
    # one process joined the run, the program; its model's size, not a transform's 0
    assert [j["config"]["n_params"] for j in _attached(wrapper["run_id"])] == [
        sum(p.numel() for p in TinyLM().parameters())
    ]


def test_pool_workers_that_only_call_the_model_leave_no_run():
    """Forked workers call the model (in training mode) and never step: no run of theirs, where
    one each used to end as killed (and alert) when the Pool ended them."""
    done, wrapper = _run("pool", "pool-fork")
    assert "scores [" in done.stdout
    assert _job(wrapper["run_id"]) == {}
    assert [s["loss"] for s in steps_of(wrapper["run_id"])] == pytest.approx(
        _logged(done.stdout, "main"), rel=1e-5
    )
    assert wrapper["status"] == "finished"

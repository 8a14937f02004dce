"""OOM postmortems: a real host OOM in a child process, the GPU capture path fed by a fake
allocator state, the store applier (daemon-side neighbours, replay), and `gpuwatch oom`."""

from __future__ import annotations

import json
import os
import pickle
import re
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import fake_pynvml
import pytest
from click.testing import CliRunner

from gpuwatch.cli import main as cli
from gpuwatch.client import oom
from gpuwatch.store import insert_rows, open_rw, postmortems
from gpuwatch.store.events import Peer, apply_events

REPO = Path(__file__).resolve().parent.parent
GiB = 1 << 30
MiB = 1 << 20


# ---- a real host OOM ------------------------------------------------------------------------

# Naive attention's B·H·L² scores at L=8192, B=4, H=4 in fp32: one 4 GiB tensor, which the CPU
# allocator refuses under a 3 GiB address-space limit. Uncaught: track() must re-raise it.
HOST_OOM_WORKLOAD = """
import torch, gpuwatch
B, H, L, D = 4, 4, 8192, 16
config = {"attn": "naive", "batch": B, "heads": H, "seq_len": L, "precision": "fp32"}

def attend(q, k):
    return q @ k.transpose(-2, -1)

with gpuwatch.track(name="host-oom", config=config):
    attend(torch.randn(B, H, L, D), torch.randn(B, H, L, D))
"""
AS_LIMIT = 3 * GiB


def _limit_address_space():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


@pytest.fixture(scope="module")
def host_oom(tmp_path_factory):
    """One real host OOM, shared by the tests that look at it (a torch child is slow to start)."""
    db = tmp_path_factory.mktemp("hostoom") / "gw.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env.update(GPUWATCH_DB=str(db), GPUWATCH_SOCKET=os.devnull, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", HOST_OOM_WORKLOAD],
        cwd=REPO,
        env=env,
        preexec_fn=_limit_address_space,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return db, done


def test_host_oom_is_reraised_and_recorded_with_the_requested_size(host_oom):
    db, done = host_oom
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "in attend" in done.stderr  # re-raised, not swallowed
    asked = re.search(r"you tried to allocate (\d+) bytes", done.stderr)
    assert asked, done.stderr[-2000:]
    conn = open_rw(db)
    status, error_type = conn.execute(
        "SELECT status, error_type FROM runs WHERE name = 'host-oom'"
    ).fetchone()
    run_id = conn.execute("SELECT run_id FROM runs WHERE name = 'host-oom'").fetchone()[0]
    [pm] = postmortems.for_run(conn, run_id)
    conn.close()
    assert (status, error_type) == ("oom", "RuntimeError")
    assert pm.kind == "host"
    assert pm.requested_bytes == int(asked.group(1)) == 4 * 4 * 8192 * 8192 * 4
    assert pm.stats["rlimit_as_bytes"] == AS_LIMIT
    assert 0 < pm.rss_bytes < AS_LIMIT
    assert (pm.step, pm.seq_len, pm.batch, pm.phase) == (1, 8192, 4, "forward")
    assert "DefaultCPUAllocator" in pm.traceback and "attend" in pm.traceback
    titles = [a["title"] for a in pm.advice]
    assert "Address-space limit (ulimit -v)" in titles
    attention = next(a["detail"] for a in pm.advice if a["title"].startswith("Attention"))
    assert "4.0 GiB" in attention and "L=8192" in attention


def test_gpuwatch_oom_lists_and_shows_the_host_postmortem(host_oom):
    db, _ = host_oom
    runner = CliRunner()
    listed = runner.invoke(cli, ["oom", "--db", str(db)])
    assert listed.exit_code == 0, listed.output
    assert "host-oom" in listed.output and "4.0 GiB" in listed.output
    shown = runner.invoke(cli, ["oom", "--db", str(db), "host-oom"])
    assert shown.exit_code == 0, shown.output
    assert "requested 4.0 GiB" in shown.output
    assert "RLIMIT_AS 3.0 GiB" in shown.output
    assert "naive attention needs 4.0 GiB" in shown.output
    assert "DefaultCPUAllocator" in shown.output  # traceback tail


def test_gpuwatch_oom_on_a_run_without_one_says_so(tmp_path):
    db = tmp_path / "gw.db"
    conn = open_rw(db)
    _start_run(conn, "fine1", uid=os.getuid())
    conn.commit()
    conn.close()
    result = CliRunner().invoke(cli, ["oom", "--db", str(db), "fine1"])
    assert result.exit_code == 1
    assert (
        result.output.strip().splitlines()[-1] == "Error: run fine1 has no OOM postmortem (status: running)"
    )


# ---- the GPU path with a fake allocator state ---------------------------------------------------


def _frames(name: str) -> list[dict]:
    return [
        {"filename": "/work/model.py", "line": 51, "name": name},
        {"filename": "/work/train.py", "line": 210, "name": "train"},
    ]


def fake_cuda(free=1536 * MiB, total=80 * GiB, allocated=60 * GiB, reserved=76 * GiB):
    """The part of torch.cuda the capture reads, with a fixed allocator state (simulated)."""
    snapshot = {
        "segments": [
            {
                "blocks": [
                    {"size": 8 * GiB, "state": "active_allocated", "frames": _frames("attend")},
                    {"size": 2 * GiB, "state": "inactive"},
                    {"size": 512 * MiB, "state": "active_allocated", "frames": _frames("mlp")},
                ]
            },
            {"blocks": [{"size": 16 * GiB, "state": "active_allocated", "frames": _frames("embed")}]},
        ],
        "device_traces": [],
    }
    stats = {
        "allocated_bytes.all.current": allocated,
        "reserved_bytes.all.current": reserved,
        "num_ooms": 1,
        "num_alloc_retries": 3,
    }
    return SimpleNamespace(
        current_device=lambda: 0,
        mem_get_info=lambda device: (free, total),
        memory_stats=lambda device: stats,
        memory_summary=lambda device: "|  PyTorch CUDA memory summary (simulated)  |",
        memory=SimpleNamespace(_snapshot=lambda: snapshot),
    )


CUDA_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.50 GiB is free."
)


def _raised(message: str) -> RuntimeError:
    try:
        raise RuntimeError(message)
    except RuntimeError as e:
        return e


def test_gpu_capture_from_fake_allocator_state(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=2, procs={0: [os.getpid(), 4000001], 1: [4000002]})
    fields = oom.postmortem(
        _raised(CUDA_MESSAGE),
        run_dir=tmp_path / "run1",
        step=7,
        seq_len=4096,
        batch=2,
        config={"precision": "bf16"},
        cuda=fake_cuda(),
        nvml=nvml,
    )
    assert fields["oom_kind"] == "gpu" and fields["device"] == 0
    assert fields["requested_bytes"] == 2 * GiB  # parsed from the message: no observer fired
    assert (fields["free_bytes"], fields["total_bytes"]) == (1536 * MiB, 80 * GiB)
    assert (fields["allocated_bytes"], fields["reserved_bytes"]) == (60 * GiB, 76 * GiB)
    assert fields["stats"]["num_alloc_retries"] == 3
    assert [b["size_bytes"] for b in fields["largest_blocks"]] == [16 * GiB, 8 * GiB, 512 * MiB]
    assert fields["largest_blocks"][1]["stack"][0] == "/work/model.py:51 attend"
    with open(fields["snapshot_path"], "rb") as f:  # what memory_viz opens
        assert len(pickle.load(f)["segments"]) == 2
    # NVML: the other process on GPU 0 only, not ourselves, not GPU 1's.
    assert [n["pid"] for n in fields["neighbours"]] == [4000001]
    assert fields["neighbours"][0]["used_mem_bytes"] > 0
    assert set(fields["stats"]["gpu_free_bytes"]) == {"0", "1"}
    fragmentation = next(a for a in fields["advice"] if a["title"] == "Fragmented allocator cache")
    assert "16.0 GiB reserved but unallocated" in fragmentation["detail"]
    assert "expandable_segments:True" in fragmentation["detail"]
    assert (fields["step"], fields["seq_len"], fields["batch"]) == (7, 4096, 2)


def test_the_allocator_observer_figures_win_over_the_message(tmp_path):
    oom._observed[0] = (3 * GiB + 5, 70 * GiB, 1 * GiB)  # as the allocator's observer leaves them
    fields = oom.gpu_figures(_raised(CUDA_MESSAGE), fake_cuda(), snapshot_dir=tmp_path)
    assert fields["requested_bytes"] == 3 * GiB + 5
    assert 0 not in oom._observed  # used once


def test_no_snapshot_file_without_recorded_history(tmp_path):
    cuda = fake_cuda()
    bare = {"segments": [{"blocks": [{"size": GiB, "state": "active_allocated"}]}]}
    cuda.memory = SimpleNamespace(_snapshot=lambda: bare)
    fields = oom.gpu_figures(_raised(CUDA_MESSAGE), cuda, snapshot_dir=tmp_path)
    assert "snapshot_path" not in fields and "largest_blocks" not in fields
    assert not (tmp_path / oom.SNAPSHOT_NAME).exists()


def test_requested_bytes_from_messages():
    assert oom.requested_bytes_from_message(CUDA_MESSAGE) == 2 * GiB
    assert oom.requested_bytes_from_message("Tried to allocate 20.00 MiB (GPU 0)") == 20 * MiB
    assert (
        oom.requested_bytes_from_message(
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 123456 bytes."
        )
        == 123456
    )
    assert oom.requested_bytes_from_message("something else") is None


def test_phase_is_backward_when_autograd_raised():
    torch = pytest.importorskip("torch")

    class Exploding(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB (simulated)")

    x = torch.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError) as forward_err:
        torch.empty(-1)
    with pytest.raises(RuntimeError) as backward_err:
        Exploding.apply(x).sum().backward()
    assert oom.phase_of(backward_err.value.__traceback__) == "backward"
    assert oom.phase_of(forward_err.value.__traceback__) == "forward"


# ---- the store: applier, daemon-side neighbours, replay ------------------------------------------


def _start_run(conn, run_id: str, uid: int, pid: int = 100):
    peer = Peer(uid=uid, user="alice", pid=pid, mode="daemon")
    apply_events(conn, [{"id": f"{run_id}-s", "kind": "run_start", "run_id": run_id, "ts_ms": 1000}], peer)
    return peer


def test_daemon_fills_neighbours_from_its_samples_and_replay_adds_nothing(tmp_path):
    conn = open_rw(tmp_path / "gw.db")
    peer = _start_run(conn, "r1", uid=1000, pid=100)
    insert_rows(
        conn,
        "processes",
        [
            {
                "pid": 200,
                "start_ms": 1,
                "user": "bob",
                "run_id": "bobs",
                "first_seen_ms": 1,
                "last_seen_ms": 9000,
            },
            {"pid": 100, "start_ms": 1, "user": "alice", "first_seen_ms": 1, "last_seen_ms": 9000},
        ],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [
            {"gpu_index": 0, "pid": 200, "ts_ms": 4000, "used_mem_bytes": 40 * GiB},  # older tick
            {"gpu_index": 0, "pid": 200, "ts_ms": 9000, "used_mem_bytes": 50 * GiB},
            {"gpu_index": 0, "pid": 100, "ts_ms": 9000, "used_mem_bytes": 29 * GiB},
            {"gpu_index": 1, "pid": 300, "ts_ms": 9000, "used_mem_bytes": 10 * GiB},
        ],
    )
    event = {
        "id": "o1",
        "kind": "oom_postmortem",
        "run_id": "r1",
        "ts_ms": 9500,
        "oom_kind": "gpu",
        "device": 0,
        "requested_bytes": 2 * GiB,
        "advice": [{"title": "t", "detail": "d"}],
    }
    assert apply_events(conn, [event], peer).applied == ["o1"]
    assert apply_events(conn, [dict(event, id="o1-again")], peer).applied == ["o1-again"]
    conn.commit()
    [pm] = postmortems.for_run(conn, "r1")
    assert pm.neighbours == [{"pid": 200, "user": "bob", "used_mem_bytes": 50 * GiB, "run_id": "bobs"}]
    assert pm.advice == [{"title": "t", "detail": "d"}]


def test_neighbours_from_the_client_get_their_runs_from_the_store(tmp_path):
    conn = open_rw(tmp_path / "gw.db")
    peer = _start_run(conn, "r1", uid=1000, pid=100)
    insert_rows(
        conn,
        "processes",
        [
            {"pid": 200, "start_ms": 1, "run_id": "old", "first_seen_ms": 1, "last_seen_ms": 2},
            {"pid": 200, "start_ms": 5, "run_id": "bobs", "first_seen_ms": 5, "last_seen_ms": 9},
        ],
    )
    event = {
        "id": "o1",
        "kind": "oom_postmortem",
        "run_id": "r1",
        "ts_ms": 9500,
        "oom_kind": "gpu",
        "device": 0,
        "neighbours": [
            {"pid": 200, "user": "bob", "used_mem_bytes": GiB},
            {"pid": 300, "user": None, "used_mem_bytes": GiB},
        ],
    }
    apply_events(conn, [event], peer)
    [pm] = postmortems.for_run(conn, "r1")
    assert [(n["pid"], n["run_id"]) for n in pm.neighbours] == [(200, "bobs"), (300, None)]


def test_postmortem_for_someone_elses_run_is_refused(tmp_path):
    conn = open_rw(tmp_path / "gw.db")
    _start_run(conn, "r1", uid=1000)
    other = Peer(uid=1001, user="mallory", pid=5, mode="daemon")
    outcome = apply_events(
        conn, [{"id": "x", "kind": "oom_postmortem", "run_id": "r1", "ts_ms": 5, "oom_kind": "host"}], other
    )
    assert outcome.rejected and outcome.rejected[0][1] == "forbidden"
    assert conn.execute("SELECT count(*) FROM oom_postmortems").fetchone()[0] == 0


@pytest.mark.gpu
def test_real_cuda_oom_is_recorded(tmp_path):
    """A real CUDA OOM under track(): postmortem with the allocator's figures, error re-raised."""
    code = """
import torch, gpuwatch
with gpuwatch.track(name="cuda-oom", config={"batch": 1}) as run:
    torch.ones(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    torch.empty(total * 2, dtype=torch.uint8, device="cuda")
"""
    env = dict(
        os.environ,
        GPUWATCH_DB=str(tmp_path / "gw.db"),
        GPUWATCH_SOCKET=os.devnull,
        GPUWATCH_RUNS_DIR=str(tmp_path / "runs"),
        PYTHONPATH=str(REPO),
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "OutOfMemoryError" in done.stderr
    conn = open_rw(tmp_path / "gw.db")
    run_id, status = conn.execute("SELECT run_id, status FROM runs WHERE name = 'cuda-oom'").fetchone()
    [pm] = postmortems.for_run(conn, run_id)
    assert status == "oom" and pm.kind == "gpu"
    assert pm.requested_bytes >= pm.total_bytes  # twice the GPU, in the allocator's rounding
    assert pm.free_bytes < pm.total_bytes and pm.neighbours is not None
    assert json.dumps(pm.advice)

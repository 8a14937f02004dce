"""The client API in embedded mode (no daemon): real transport, real SQLite, real torch model."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from systools import wait_for

import gpuwatch
from gpuwatch.base import paths
from gpuwatch.client import flops, metadata, torch_stats
from gpuwatch.client.run import is_oom

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]


def db() -> sqlite3.Connection:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    conn.row_factory = sqlite3.Row
    return conn


def the_run() -> sqlite3.Row:
    rows = db().execute("SELECT * FROM runs").fetchall()
    assert len(rows) == 1, [dict(r) for r in rows]
    return rows[0]


def run_script(body: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PY, "-c", textwrap.dedent(body)], capture_output=True, text=True, timeout=60, **kwargs
    )


def test_import_leaves_torch_and_textual_out():
    out = run_script("""
        import sys, gpuwatch.client, gpuwatch.cli.run_cmd, gpuwatch.cli.runs_cmd
        print('torch' in sys.modules, 'textual' in sys.modules)
    """)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.slow
def test_training_steps_are_recorded_with_rates_losses_and_memory():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch, seq = 4, 16
    losses = []
    with gpuwatch.track(name="tiny-lm", config={"lr": 1e-3, "seq": seq}) as run:
        for _ in range(5):
            x = torch.randint(0, 64, (batch, seq))
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
            run.step(tokens=batch * seq, samples=batch, seq_len=seq, loss=loss)
        run_id = run.run_id

    assert len(run_id) == 12 and int(run_id, 16) >= 0
    r = the_run()
    assert (r["run_id"], r["name"], r["status"], r["mode"]) == (run_id, "tiny-lm", "finished", "embedded")
    assert r["config_json"] == '{"lr":0.001,"seq":16}'
    assert r["torch_version"] == torch.__version__
    assert r["uid"] == os.getuid() and r["ended_ms"] >= r["started_ms"]
    steps = db().execute("SELECT * FROM steps ORDER BY step").fetchall()
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    wall_ms = r["ended_ms"] - r["started_ms"] + 2
    for s, loss in zip(steps, losses):
        assert 0 < s["step_time_ms"] < wall_ms
        assert s["tokens_per_s"] == pytest.approx(64 / (s["step_time_ms"] / 1000))
        assert s["loss"] == pytest.approx(loss)
        assert s["rss_bytes"] > 10 * 2**20  # torch alone makes the process this big
        assert s["mem_allocated_bytes"] is None and s["mfu"] is None  # CPU: no allocator, no peak
    assert sum(s["step_time_ms"] for s in steps) <= wall_ms


def test_steps_reach_the_database_while_the_run_pauses_after_them():
    """Steps in quick succession become events a burst at a time; a run that then pauses (an
    eval, a long wait) still has its last steps stored, not held back until its next step."""
    with gpuwatch.track(name="pausing") as run:
        for n in range(3):
            run.step(tokens=100 + n)
        stored = wait_for(
            lambda: db().execute("SELECT group_concat(tokens) FROM steps").fetchone()[0] == "100,101,102"
        )
        assert stored


def test_tensor_counts_and_flops_per_token_are_stored_as_plain_numbers():
    torch = pytest.importorskip("torch")
    with gpuwatch.track(flops_per_token=torch.tensor(1.5e9).item()) as run:
        run.step(tokens=torch.tensor(4096), samples=torch.tensor(2), seq_len=2048, loss=1.25)
    step = db().execute("SELECT tokens, samples, seq_len, loss FROM steps").fetchone()
    assert tuple(step) == (4096, 2, 2048, 1.25)
    assert the_run()["flops_per_token"] == 1.5e9


def test_the_stored_config_is_the_one_given_at_the_start_whatever_the_run_learns_later():
    """note_shape() (the zero-code hooks' first forward) adds to the run's own copy, never to
    the start event still waiting for the sender thread."""
    with gpuwatch.track(config={"lr": 0.1, "batch": 4}) as run:
        run.note_shape(4, 16, heads=8, attn="sdpa", precision="bf16")
        run.step(tokens=64, loss=1.0)
    assert json.loads(the_run()["config_json"]) == {"lr": 0.1, "batch": 4}


def test_exception_marks_run_failed_with_type_and_message():
    with pytest.raises(ValueError, match="bad batch"):
        with gpuwatch.track(name="boom") as run:
            run.step(tokens=1)
            raise ValueError("bad batch at step 2")
    r = the_run()
    assert (r["status"], r["error_type"], r["error_message"]) == (
        "failed",
        "ValueError",
        "bad batch at step 2",
    )


def test_memory_error_marks_oom_and_is_reraised():
    with pytest.raises(MemoryError):
        with gpuwatch.track():
            raise MemoryError()
    assert (the_run()["status"], the_run()["error_type"]) == ("oom", "MemoryError")


def test_torch_cpu_allocator_failure_is_an_oom():
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as caught:
        with gpuwatch.track():
            torch.empty(1 << 60, dtype=torch.uint8)  # 1 EiB: the allocator refuses
    assert is_oom(caught.value)
    assert the_run()["status"] == "oom"


def test_keyboard_interrupt_marks_killed_by_sigint():
    with pytest.raises(KeyboardInterrupt):
        with gpuwatch.track():
            raise KeyboardInterrupt
    assert (the_run()["status"], the_run()["signal"]) == ("killed", signal.SIGINT)


def test_sigterm_records_killed_then_dies_by_sigterm():
    proc = subprocess.Popen(
        [
            PY,
            "-c",
            textwrap.dedent("""
        import time, gpuwatch
        with gpuwatch.track(name="victim") as run:
            run.step(tokens=8)
            print("ready", flush=True)
            time.sleep(60)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    r = the_run()
    assert (r["name"], r["status"], r["signal"]) == ("victim", "killed", signal.SIGTERM)


THREAD_MASKS = """
import json, signal, threading, time
import gpuwatch
from gpuwatch.base.config import load
from gpuwatch.client.transport import EmbeddedTransport


def blocks_kill_and_ctrl_c(thread):
    status = open(f"/proc/self/task/{thread.native_id}/status").read()
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return all(mask >> (s - 1) & 1 for s in (signal.SIGTERM, signal.SIGINT))


# Each thread's, once the sampler runs; a thread still starting has no id yet, and one that
# ended between the listing and the read has no status: look again.
def masks():
    while True:
        threads = threading.enumerate()
        if all(t.native_id is not None for t in threads) and any(t.name == "gpuwatch-sampler" for t in threads):
            try:
                return {t.name: blocks_kill_and_ctrl_c(t) for t in threads}
            except FileNotFoundError:
                pass
        time.sleep(0.05)


with gpuwatch.track(name="masks") as run:
    run.step(tokens=8)
    # What a run records through when its helper cannot start: a writer and a sampler in here.
    embedded = EmbeddedTransport(load())
    print(json.dumps(masks()), flush=True)
    embedded.close()
"""


def test_our_threads_in_a_program_leave_its_signals_to_its_main_thread():
    """A `kill` or a Ctrl-C goes to any thread that does not block it, and Python runs the
    handler in the main thread only, without waking it from the call it is blocked in: a
    tracked program asleep when a thread of ours took its SIGTERM lived on until its sleep
    ended (1 kill in ~180 under load). Every thread gpuwatch starts in the program blocks them."""
    done = subprocess.run(
        [PY, "-c", THREAD_MASKS],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, GPUWATCH_INTERVAL="0.2", GPUWATCH_HOST_INTERVAL="0.2"),
    )
    assert done.returncode == 0, done.stderr
    masks = json.loads(done.stdout.splitlines()[-1])
    assert masks.pop("MainThread") is False
    ours = {name for name in masks if name.startswith("gpuwatch")}
    assert {"gpuwatch-steps", "gpuwatch-sender", "gpuwatch-writer", "gpuwatch-sampler"} <= ours, masks
    assert all(masks[name] for name in ours), masks


def test_user_sigterm_handler_is_left_alone():
    out = run_script("""
        import signal, gpuwatch
        mine = lambda *a: None
        signal.signal(signal.SIGTERM, mine)
        with gpuwatch.track():
            print(signal.getsignal(signal.SIGTERM) is mine)
        print(signal.getsignal(signal.SIGTERM) is mine)
    """)
    assert out.stdout.split() == ["True", "True"], out.stderr


def test_run_without_with_ends_failed_on_uncaught_exception_and_finished_at_exit():
    out = run_script("""
        import gpuwatch
        run = gpuwatch.track(name="loose")
        run.step(tokens=4)
        raise RuntimeError("late failure")
    """)
    assert "late failure" in out.stderr and out.returncode == 1
    assert (the_run()["status"], the_run()["error_type"]) == ("failed", "RuntimeError")
    run_script("import gpuwatch; gpuwatch.track(name='quiet').step(tokens=1)")
    assert db().execute("SELECT status FROM runs WHERE name = 'quiet'").fetchone()[0] == "finished"


def test_generation_accounting_with_a_fake_clock():
    now = [100.0]
    with gpuwatch.track() as run:
        with run.generate(prompt_tokens=7, clock=lambda: now[0]) as gen:
            for gap_s in (0.250, 0.020, 0.030, 0.040, 0.010):  # first token after 250 ms
                now[0] += gap_s
                gen.token()
        run.generation(prompt_tokens=3, new_tokens=10, ttft_ms=50.0, itl_ms=[5.0] * 9)
    g1, g2 = db().execute("SELECT * FROM generations ORDER BY gen_id").fetchall()
    assert (g1["prompt_tokens"], g1["new_tokens"]) == (7, 5)
    assert g1["ttft_ms"] == pytest.approx(250.0)
    # ITLs 10, 20, 30, 40 ms: median 25; 90th percentile, linear: 30 + 0.7 * (40 - 30) = 37
    assert g1["itl_p50_ms"] == pytest.approx(25.0)
    assert g1["itl_p90_ms"] == pytest.approx(37.0)
    assert g1["tokens_per_s"] == pytest.approx(5 / 0.350)
    assert g2["tokens_per_s"] == pytest.approx(10 / 0.095) and g2["itl_p50_ms"] == pytest.approx(5.0)


def test_run_events_keep_their_kind_and_payload():
    with gpuwatch.track() as run:
        run.event("checkpoint", {"path": "/ckpt/step100.pt"})
        run.event("checkpoint", {"path": "/ckpt/step200.pt"})
    rows = db().execute("SELECT kind, payload_json FROM run_events ORDER BY seq").fetchall()
    assert [tuple(r) for r in rows] == [
        ("checkpoint", '{"path":"/ckpt/step100.pt"}'),
        ("checkpoint", '{"path":"/ckpt/step200.pt"}'),
    ]


def test_transformer_flops_match_the_palm_formula_by_hand():
    # GPT-2 small: L=12, d=768, T=1024, V=50257.
    n = 12 * 12 * 768**2 + 50257 * 768  # 84,934,656 + 38,597,376 = 123,532,032
    assert n == 123_532_032
    attention = 12 * 12 * 768 * 1024  # 113,246,208
    assert flops.transformer_flops_per_token(12, 768, 1024, 50257) == 6 * n + attention == 854_438_400
    assert flops.transformer_flops_per_token(12, 768, 1024, 50257, training=False) == pytest.approx(
        854_438_400 / 3
    )
    assert flops.transformer_flops_per_token(2, 64, 128, 100, n_params=1000) == 6000 + 12 * 2 * 64 * 128
    with pytest.raises(ValueError, match="seq_len"):
        flops.transformer_flops_per_token(2, 64, 0, 100)


def test_peak_flops_by_gpu_name_and_mfu():
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.5e12
    assert flops.peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert flops.peak_flops("NVIDIA H200", "fp32") == 67e12
    assert flops.peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert flops.peak_flops("NVIDIA A10", "bf16") == 125e12  # not mistaken for an A100
    assert flops.peak_flops("NVIDIA L40S", "bf16") == 362e12
    assert flops.peak_flops("NVIDIA GeForce RTX 4090", "fp16") == 165.2e12
    assert flops.peak_flops("Tesla V100-SXM2-32GB", "bf16") is None  # no bf16 tensor cores
    assert flops.peak_flops("Some Future GPU", "bf16") is None
    with pytest.raises(ValueError, match="int8"):
        flops.peak_flops("NVIDIA H100", "int8")
    # 40k tokens/s of GPT-2 small on an A100: 40,000 * 854,438,400 / 312e12 = 0.10954...
    assert flops.mfu(40_000, 854_438_400, 312e12) == pytest.approx(0.109543, rel=1e-5)
    assert flops.mfu(40_000, None, 312e12) is None


def test_metadata_ranks_job_ids_and_gpus():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "abc"}
    assert metadata.ranks(env) == (3, 1, 8)
    assert metadata.job_id(env) == "torchrun-abc"
    assert metadata.job_id({**env, "SLURM_JOB_ID": "991", "SLURM_STEP_ID": "0"}) == "slurm-991.0"
    assert metadata.job_id({"TORCHELASTIC_RUN_ID": "none"}, wrapper_run_id="feedbeef0000") == "feedbeef0000"
    assert metadata.job_id({}) is None
    assert metadata.ranks({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4"}) == (2, 0, 4)
    # Lightning's DDP launcher: no RANK; a second node's ranks are torch.distributed's to say
    lightning = {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}
    assert metadata.ranks(lightning) == (1, 1, 2)
    assert metadata.ranks({**lightning, "NODE_RANK": "1", "WORLD_SIZE": "4"}) == (None, 1, 4)
    assert metadata.gpu_uuids({"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}) == "GPU-aaa,GPU-bbb"
    assert metadata.gpu_uuids({}) is None


def test_a_process_knows_when_it_started_without_psutil(monkeypatch):
    """A rank's or worker's run lasts as long as its process, also in the program's own
    interpreter, which may lack psutil: /proc says what psutil would."""
    import psutil

    expected = psutil.Process().create_time()
    monkeypatch.setitem(sys.modules, "psutil", None)  # `import psutil` raises ImportError
    assert metadata.process_start_s() == pytest.approx(expected, abs=0.02)


def _torchrun_env(node: int, local_rank: int, rdzv_id: str, **extra) -> dict:
    """What torchrun gives rank `local_rank` on node `node` of a 2-node x 4-GPU job."""
    return {
        "RANK": str(node * 4 + local_rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": "2",
        "TORCHELASTIC_RUN_ID": rdzv_id,
        "MASTER_ADDR": "node-a",
        "MASTER_PORT": "29500",
        **extra,
    }


@pytest.mark.parametrize("rdzv_id", ["job42", "none"])
def test_a_multi_node_job_has_one_id_on_every_host(monkeypatch, rdzv_id):
    """Two hosts, each with its own launcher (different start times, different `gpuwatch run`
    wrappers), compute the same id for their ranks: c10d rendezvous and static (run id "none")."""
    ids = set()
    for node, launcher_start in ((0, 1_700_000_000), (1, 1_700_000_007)):
        monkeypatch.setattr(metadata, "_parent_start_s", lambda s=launcher_start: s)
        for local_rank in range(4):
            ids.add(
                metadata.job_id(
                    _torchrun_env(node, local_rank, rdzv_id), wrapper_run_id=f"wrapper-on-node-{node}"
                )
            )
    assert len(ids) == 1 and None not in ids
    # The same rendezvous id on another cluster (another endpoint) is another job.
    other = metadata.job_id(_torchrun_env(0, 0, rdzv_id, MASTER_ADDR="node-z"))
    assert other not in ids
    # A Slurm job is its job id on every node.
    assert {metadata.job_id(_torchrun_env(n, 0, rdzv_id, SLURM_JOB_ID="77")) for n in (0, 1)} == {"slurm-77"}


def test_single_node_jobs_on_one_endpoint_stay_apart(monkeypatch):
    """On one host a static rendezvous endpoint is reused by job after job: the launcher's
    start time (or the wrapper's run id) keeps them apart."""
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_WORLD_SIZE": "1",
        "TORCHELASTIC_RUN_ID": "none",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    monkeypatch.setattr(metadata, "_parent_start_s", lambda: 100)
    first = metadata.job_id(env)
    monkeypatch.setattr(metadata, "_parent_start_s", lambda: 200)
    assert metadata.job_id(env) != first
    assert metadata.job_id(env, wrapper_run_id="w1") == "w1"


def test_gpu_indices_become_uuids_through_nvml(monkeypatch):
    import fake_pynvml

    fake_pynvml.configure(gpus=2)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    uuids = metadata.gpu_uuids({"CUDA_VISIBLE_DEVICES": "1,0"}).split(",")
    assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids) and uuids[0] != uuids[1]


def test_git_commit_inside_and_outside_a_repository(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    assert metadata.git_commit(str(repo)) == head
    outside = tmp_path / "plain"
    outside.mkdir()
    assert metadata.git_commit(str(outside)) is None


def test_git_commit_is_taken_from_the_wrappers_finding_for_the_same_directory(tmp_path, monkeypatch):
    """`gpuwatch run` passes the HEAD it found (GitHead.env_value) to its command: a child in the
    same directory records it without running git; one elsewhere asks git."""
    outside = str(tmp_path)
    found = metadata.GitHead(outside)
    assert found.commit() is None and found.env_value() == f"- {outside}"
    env = {metadata.ENV_GIT_HEAD: f"0123abc {outside}"}
    assert metadata.git_commit(outside, env) == "0123abc"
    assert metadata.git_commit(outside, {metadata.ENV_GIT_HEAD: found.env_value()}) is None
    monkeypatch.chdir(tmp_path)
    assert metadata.collect(env)["git_commit"] == "0123abc"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert metadata.git_commit(str(elsewhere), env) is None  # git's own answer there


def test_memory_stats_fields_tolerate_missing_keys():
    full = {"num_alloc_retries": 2, "num_ooms": 1, "inactive_split_bytes.all.current": 4096}
    assert torch_stats.memory_stats_fields(full) == {
        "num_alloc_retries": 2,
        "num_ooms": 1,
        "inactive_split_bytes": 4096,
        "stats": full,
    }
    assert torch_stats.memory_stats_fields({})["inactive_split_bytes"] is None


@pytest.mark.gpu
def test_cuda_steps_have_event_timings_allocator_figures_and_mfu():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(1024, 1024, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    with gpuwatch.track(flops_per_token=6 * 1024 * 1024) as run:
        for _ in range(60):  # past memory_stats_every (50)
            loss = model(x).float().pow(2).mean()
            loss.backward()
            run.step(tokens=64, loss=loss)
    steps = db().execute("SELECT * FROM steps ORDER BY step").fetchall()
    assert len(steps) == 60
    assert steps[0]["step_time_ms"] is not None  # CUDA was initialised before track()
    assert all(
        s["step_time_ms"] > 0 and s["mem_allocated_bytes"] > 0 and s["loss"] is not None for s in steps
    )
    assert all(s["mfu"] is None or 0 < s["mfu"] < 1 for s in steps)
    assert db().execute("SELECT count(*) FROM memory_stats").fetchone()[0] == 1


BESIDE = """
import os, sqlite3, sys, threading, time
import gpuwatch
from gpuwatch.base import paths
from gpuwatch.base.config import load
from gpuwatch.client import helpers

def sampled():
    conn = sqlite3.connect(paths.default_db_path(system=False))
    try:
        return all(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                   for t in ("gpu_samples", "host_samples", "runs"))  # runs: our start is stored
    except sqlite3.OperationalError:  # the tables are not there yet
        return False
    finally:
        conn.close()

with gpuwatch.track(name="beside") as run:
    run.step(tokens=1)
    deadline = time.monotonic() + 60
    while not sampled() and time.monotonic() < deadline:
        time.sleep(0.05)
    helper = helpers.recorder_pid()
    print(os.getpid(), helper, os.getpriority(os.PRIO_PROCESS, helper) - os.getpriority(os.PRIO_PROCESS, 0),
          ",".join(t.name for t in threading.enumerate()), helpers.recorder_socket(load()).parent, flush=True)
    if sys.argv[1] == "wait":
        time.sleep(600)  # until the test kills it
"""


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("end", ["exit", "SIGKILL"])
def test_with_no_daemon_a_low_priority_helper_samples_beside_the_program_and_ends_with_it(end):
    """track() with no daemon: the GPU/host samples (fake NVML, 2 GPUs) come from a helper
    process at nice +10, not from a thread of the program; the helper ends when the program
    does, also when the program is SIGKILLed, and leaves nothing behind in the temp folder."""
    env = dict(
        os.environ,
        FAKE_NVML_GPUS="2",
        GPUWATCH_INTERVAL="0.2",
        GPUWATCH_HOST_INTERVAL="0.2",
        GPUWATCH_SOCKET=os.devnull,  # no daemon
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "fake_driver"), str(ROOT)]),
    )
    program = subprocess.Popen(
        [PY, "-c", BESIDE, "wait" if end == "SIGKILL" else "end"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pid, helper, nicer, threads, private = program.stdout.readline().split()
        assert os.path.exists(os.path.join(private, "sock"))
        assert int(pid) == program.pid and int(helper) != program.pid
        assert int(nicer) >= min(10, 19 - os.getpriority(os.PRIO_PROCESS, 0))
        assert "gpuwatch-sampler" not in threads.split(",")  # nothing samples inside the program
        if end == "SIGKILL":
            assert not _gone(int(helper))
            program.kill()
        assert program.wait(60) in (0, -signal.SIGKILL), program.stderr.read()
        assert wait_for(lambda: _gone(int(helper)), timeout=30)
        assert not os.path.exists(private)  # its socket's private folder
    finally:
        program.kill()
        program.wait()
    gpus = db().execute("SELECT DISTINCT gpu_index FROM gpu_samples ORDER BY gpu_index").fetchall()
    assert [g[0] for g in gpus] == [0, 1]
    assert db().execute("SELECT count(*) FROM host_samples").fetchone()[0] > 0
    assert [r[0] for r in db().execute("SELECT name FROM runs")] == ["beside"]


def test_with_no_daemon_every_line_of_ours_on_the_programs_stderr_says_it_is_ours():
    """track() with no daemon records through a helper that shares the program's terminal: its
    lines (here, that this host has no GPU driver) begin with `gpuwatch:`."""
    script = "import gpuwatch\nwith gpuwatch.track(name='quiet') as run:\n    run.step(tokens=1)\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.strip()]
    assert ours and all(line.startswith("gpuwatch: ") for line in ours), done.stderr


class _Split(NamedTuple):
    """A caller's split readings, as the zero-code hooks hand them to step()."""

    now: float

    def fields(self) -> dict:
        return {}


def test_a_cpu_steps_time_ends_where_its_split_ended():
    """On the CPU a step given its split's readings ends where the split's interval ended: one
    clock reading for both, so step() handing the GIL away before it reads a clock (a loss's
    .item() can, for up to 5 ms) cannot move time between the step's time and its split's."""
    with gpuwatch.track(name="split-clock") as run:
        start = time.perf_counter()
        run.step(tokens=1, split=_Split(start))
        time.sleep(0.05)
        run.step(tokens=1, split=_Split(start + 0.010))  # the caller's interval: 10 ms
    times = [ms for (ms,) in db().execute("SELECT step_time_ms FROM steps ORDER BY step")]
    assert times[1] == pytest.approx(10.0, abs=0.01)

"""The trace analysis gives HTA's numbers on the same traces (HTA is the test-only anchor).

Traces come from tests/trace_gen.py (Kineto format written from scratch: several streams,
runtime launches with correlation ids and flow events, NCCL, memcpy/memset, ProfilerSteps,
the data loader's spans, synchronise calls, several ranks) and from a real torch.profiler run
of a tiny model on the CPU. HTA is imported once per module: it is slow to import.
"""

from __future__ import annotations

import json
import logging
import math

import pytest
from trace_gen import make_trace, write_trace

from gpuwatch.analysis.trace import analyse_files

SCENARIOS = {
    # name: list of make_trace kwargs, one per rank
    "ddp_straggler": [dict(rank=r, world=2, slow=1.3 if r else 1.0) for r in range(2)],
    "launch_bound": [dict(cpu_gap_us=60.0, loader_us=50.0)],
    "loader_bound_gz": [dict(loader_us=9000.0, attention="math", htod_us=900.0)],
    "four_ranks": [dict(rank=r, world=4, seed=3, sync=r % 2 == 0) for r in range(4)],
}


@pytest.fixture(scope="module")
def hta():
    logging.getLogger("hta").setLevel(logging.ERROR)
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request, tmp_path_factory, hta):
    d = tmp_path_factory.mktemp(request.param)
    ext = ".json.gz" if request.param.endswith("_gz") else ".json"
    files = {
        kw.get("rank", 0): str(write_trace(d / f"rank{kw.get('rank', 0)}{ext}", make_trace(**kw)))
        for kw in SCENARIOS[request.param]
    }
    ours = analyse_files(list(files.values()))
    theirs = hta(trace_files=files, trace_dir=str(d))
    return ours, theirs


def test_temporal_breakdown_within_one_point_of_hta(scenario):
    ours, theirs = scenario
    df = theirs.get_temporal_breakdown(visualize=False).set_index("rank")
    assert [r["rank"] for r in ours["ranks"]] == sorted(df.index)
    for r in ours["ranks"]:
        row, t = df.loc[r["rank"]], r["temporal"]
        for ours_key, hta_key in (
            ("idle_pct", "idle_time_pctg"),
            ("compute_pct", "compute_time_pctg"),
            ("non_compute_pct", "non_compute_time_pctg"),
        ):
            assert abs(t[ours_key] - row[hta_key]) <= 1.0, (r["rank"], ours_key)
        assert t["kernel_time_us"] == pytest.approx(row["kernel_time(us)"], rel=0.01)


def test_kernel_totals_within_one_percent_of_hta(scenario):
    ours, theirs = scenario
    _, kernels = theirs.get_gpu_kernel_breakdown(
        visualize=False, num_kernels=10_000, duration_ratio=1.0, include_memory_kernels=True
    )
    for r in ours["ranks"]:
        hta_sums = kernels[kernels["rank"] == r["rank"]].set_index("name")["sum (us)"]
        assert r["kernels"], "no kernels found"
        for k in r["kernels"]:
            assert k["total_us"] == pytest.approx(hta_sums[k["name"]], rel=0.01), k["name"]


def test_overlap_within_one_point_of_hta(scenario):
    ours, theirs = scenario
    df = theirs.get_comm_comp_overlap(visualize=False).set_index("rank")
    for r in ours["ranks"]:
        if r["overlap_pct"] is None:  # no NCCL kernels: HTA divides 0 by 0
            assert math.isnan(df.loc[r["rank"], "comp_comm_overlap_pctg"])
            continue
        assert abs(r["overlap_pct"] - df.loc[r["rank"], "comp_comm_overlap_pctg"]) <= 1.0


def test_real_cpu_trace_agrees_with_hta(tmp_path, hta):
    """A torch.profiler trace recorded here (CPU only): step walls and operator time as HTA reads them."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(256, 64), torch.randint(0, 8, (256,))), batch_size=32
    )
    path = tmp_path / "cpu_trace.json"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=0, active=5),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for x, y in data:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    ours = analyse_files([path])["ranks"][0]
    assert ours["gpu"] is False and ours["cpu"]["wall_us"] > 0
    assert ours["cpu"]["dataloader_us"] > 0 and ours["cpu"]["optimizer_us"] > 0
    assert any(op["name"].startswith("aten::") for op in ours["operators"])

    t = hta(trace_files={0: str(path)}, trace_dir=str(tmp_path)).t
    df = t.get_trace(0)
    names = t.symbol_table.get_sym_table()
    df = df.assign(name_s=df["name"].map(lambda i: names[i]))
    steps = df[df["name_s"].str.startswith("ProfilerStep")].sort_values("ts")
    # HTA's parsed trace has already left the last (cut short) step out, as we do
    assert [s["step"] for s in ours["steps"]] == [int(n.split("#")[1]) for n in steps["name_s"]]
    assert ours["cpu"]["wall_us"] == pytest.approx(steps["dur"].sum(), rel=0.01)


def test_idle_time_matches_htas_idle_breakdown(scenario):
    """On a one-stream rank, every gap between kernels is GPU idle time: HTA's idle time
    breakdown (host wait + kernel wait + other) sums to our idle time, and what HTA calls host
    wait (the next launch came after the GPU ran dry) is what we split into launch-bound, data
    loader and synchronise, less the short gaps HTA calls kernel wait. With NCCL on a second
    stream, the GPU is idle only where the compute stream is idle too."""
    from trace_gen import COMPUTE_STREAM

    ours, theirs = scenario
    for r in ours["ranks"]:
        df, _ = theirs.get_idle_time_breakdown(ranks=[r["rank"]], visualize=False)
        compute = df[df["stream"] == COMPUTE_STREAM].groupby("idle_category")["idle_time"].sum()
        i = r["idle"]
        if r["overlap_pct"] is not None:
            assert 0 < i["idle_us"] <= compute.sum() + 1
            continue
        assert i["idle_us"] == pytest.approx(compute.sum(), rel=0.01)
        waited = i["host_wait_us"] + i["dataloader_us"] + i["sync_us"]
        assert compute.get("host_wait", 0) <= waited + 1
        assert waited <= compute.get("host_wait", 0) + compute.get("kernel_wait", 0) + 1


KERNEL_NAMES = [
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)",
    "Memcpy HtoD (Pageable -> Device)",
    "Memcpy DtoD (Device -> Device)",
    "Memset (Device)",
    "dma_copy",
    "Stream Sync",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>",
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
    "triton_poi_fused_add_mul_0",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>",
    "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)",
    "cudaMemcpyAsync_Memcpy",
]


def test_kernel_types_are_htas(hta):
    from hta.utils.utils import get_kernel_type

    from gpuwatch.analysis.trace.kinds import group, kernel_type

    assert [kernel_type(n) for n in KERNEL_NAMES] == [get_kernel_type(n) for n in KERNEL_NAMES]
    assert [group(n) for n in KERNEL_NAMES[:6]] == ["nccl", "nccl", "memcpy", "memcpy", "memset", "memcpy"]
    assert [group(n) for n in KERNEL_NAMES[7:13]] == [
        "gemm",
        "attention (flash/SDPA)",
        "attention (flash/SDPA)",
        "elementwise",
        "elementwise",
        "reduction",
    ]
    assert group(KERNEL_NAMES[7], math_attention=True) == "attention (math)"


@pytest.mark.slow
def test_a_reference_workloads_profile_is_stored_with_htas_step_times(tmp_path, hta):
    """workloads.gpt_train (CPU) with a scheduled profile window: the breakdown stored with the
    profile reads the trace as HTA does (the same ProfilerSteps, the same step time)."""
    import json
    import os
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "GPUWATCH_DB": str(tmp_path / "gw.db"),
        "GPUWATCH_RUNS_DIR": str(tmp_path / "runs"),
        "GPUWATCH_PROFILE_WAIT": "0",
        "GPUWATCH_PROFILE_WARMUP": "1",
        "GPUWATCH_PROFILE_ACTIVE": "3",
        "GPUWATCH_PROFILE_REPEAT": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "workloads.gpt_train", "--tiny", "--steps", "5", "--device", "cpu"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    conn = sqlite3.connect(tmp_path / "gw.db")
    [(trace, stored)] = conn.execute(
        "SELECT p.trace_path, b.breakdown_json FROM profiles p JOIN "
        "profile_breakdowns b ON b.profile_id = p.id"
    ).fetchall()
    conn.close()
    stored = json.loads(stored)
    assert stored["gpu"] is False and stored["cpu"]["operators_pct"] > 10
    assert stored["cpu"]["optimizer_pct"] > 0

    t = hta(trace_files={0: trace}, trace_dir=str(Path(trace).parent)).t
    df = t.get_trace(0)
    names = t.symbol_table.get_sym_table()
    steps = df[df["name"].map(lambda i: names[i].startswith("ProfilerStep"))]
    assert stored["steps_analysed"] == len(steps)
    assert stored["cpu"]["wall_us"] == pytest.approx(steps["dur"].sum(), rel=0.01)


@pytest.mark.slow
def test_the_ddp_workload_under_torchrun_is_one_job_of_two_ranks_whose_traces_read_as_one_job(tmp_path, hta):
    """workloads.ddp_train on two CPU ranks (gloo) under torchrun, a profile window each: one job
    of two finished ranks, each with every step and its own shard; the traces, given in reverse
    order, come back ranked by their distributedInfo, each rank's step time HTA's, and the slower
    rank named. (One torchrun for both: the job and its traces.)"""
    import os
    import sqlite3
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "GPUWATCH_DB": str(tmp_path / "gw.db"),
        "GPUWATCH_RUNS_DIR": str(tmp_path / "runs"),
        "GPUWATCH_PROFILE_WAIT": "0",
        "GPUWATCH_PROFILE_WARMUP": "1",
        "GPUWATCH_PROFILE_ACTIVE": "3",
        "GPUWATCH_PROFILE_REPEAT": "1",
    }
    torchrun = Path(os.sys.executable).parent / "torchrun"
    done = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "workloads.ddp_train",
            "--tiny",
            "--steps",
            "5",
            "--device",
            "cpu",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "2 ranks" in done.stdout and "GPUWATCH_RESULT" in done.stdout
    conn = sqlite3.connect(tmp_path / "gw.db")
    conn.row_factory = sqlite3.Row
    try:
        runs = conn.execute(
            "SELECT run_id, job_id, rank, world_size, status, config_json FROM runs ORDER BY rank"
        ).fetchall()
        assert [r["rank"] for r in runs] == [0, 1]
        assert {r["world_size"] for r in runs} == {2} and {r["status"] for r in runs} == {"finished"}
        assert runs[0]["job_id"] and runs[0]["job_id"] == runs[1]["job_id"]
        assert {json.loads(r["config_json"])["shard_samples"] for r in runs} == {16}  # 32 samples / 2 ranks
        for r in runs:
            tokens = conn.execute("SELECT tokens FROM steps WHERE run_id = ? ORDER BY step", (r["run_id"],))
            assert [t for (t,) in tokens] == [4 * 64] * 5
    finally:
        conn.close()
    files = sorted((tmp_path / "runs").rglob("*.json.gz"), key=lambda p: p.name[-13:], reverse=True)
    assert [f.name[-13:] for f in files] == ["rank1.json.gz", "rank0.json.gz"]
    res = analyse_files(files)
    assert [(r["rank"], Path(r["file"]).name[-13:]) for r in res["ranks"]] == [
        (0, "rank0.json.gz"),
        (1, "rank1.json.gz"),
    ]
    t = hta(trace_files={r["rank"]: r["file"] for r in res["ranks"]}, trace_dir=str(tmp_path)).t
    names = t.symbol_table.get_sym_table()
    for r in res["ranks"]:
        df = t.get_trace(r["rank"])
        steps = df[df["name"].map(lambda i: names[i].startswith("ProfilerStep"))]
        assert r["cpu"]["wall_us"] == pytest.approx(steps["dur"].sum(), rel=0.01)
    slow = res["slowest"]
    assert slow["rank"] == max(res["ranks"], key=lambda r: r["cpu"]["operators_us"])["rank"]


@pytest.mark.gpu
def test_a_real_cuda_trace_agrees_with_hta(tmp_path, hta):
    """On a GPU: a torch.profiler CUDA trace of a small attention model (GEMMs, SDPA, copies,
    a DataLoader, .item()) through both; temporal within 1 point, kernel totals within 1 %."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    dev = "cuda"
    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True).to(dev)
    opt = torch.optim.AdamW(layer.parameters())
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(64, 128, 256)), batch_size=8
    )
    path = tmp_path / "cuda_trace.json"
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=schedule(wait=1, warmup=1, active=4),
        on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
    ) as prof:
        for (x,) in data:
            loss = layer(x.to(dev, non_blocking=True)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            prof.step()
    res = analyse_files([path])
    ours = res["ranks"][0]
    assert ours["gpu"] and ours["kernels"]
    ta = hta(trace_files={0: str(path)}, trace_dir=str(tmp_path))
    row = ta.get_temporal_breakdown(visualize=False).set_index("rank").loc[0]
    t = ours["temporal"]
    assert abs(t["idle_pct"] - row["idle_time_pctg"]) <= 1.0
    assert abs(t["compute_pct"] - row["compute_time_pctg"]) <= 1.0
    assert abs(t["non_compute_pct"] - row["non_compute_time_pctg"]) <= 1.0
    _, kernels = ta.get_gpu_kernel_breakdown(
        visualize=False, num_kernels=10_000, duration_ratio=1.0, include_memory_kernels=True
    )
    sums = kernels.set_index("name")["sum (us)"]
    for k in ours["kernels"]:
        assert k["total_us"] == pytest.approx(sums[k["name"]], rel=0.01), k["name"]
    print(json.dumps({"temporal": t, "idle": ours["idle"], "advice": res["advice"]}, indent=1))

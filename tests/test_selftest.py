"""`gpuwatch selftest`: every comparison against recorded nvidia-smi output and the fake NVML.

The fixtures in tests/data/nvidia_smi are nvidia-smi's output format for 8 × H100 80GB HBM3 under
load and an A100 40GB with MIG enabled (values made up in that format, not from one machine).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import fake_pynvml
import pytest
from click.testing import CliRunner

from collectors.nvml import PCIE_DECIDE_TICKS, NvmlCollector, pcie_too_costly
from gpuwatch import selftest
from gpuwatch.cli import main
from gpuwatch.client.oom_advice import advise
from gpuwatch.selftest import compare
from gpuwatch.selftest.compare import MiB

DATA = Path(__file__).parent / "data" / "nvidia_smi"


def smi_rows(name: str, query: str = compare.SMI_GPU_QUERY) -> list[dict]:
    return compare.parse_smi_csv((DATA / name).read_text(), query)


def statuses(verdicts) -> dict[str, str]:
    return {v.name: v.status for v in verdicts}


def h100_ours(row: dict, **changes) -> dict:
    """gpuwatch's values for one GPU equal to an nvidia-smi row, then `changes` applied."""
    ours = {f.ours: row[f.smi] for f in compare.GPU_FIELDS}
    ours.update(changes)
    return ours


# ---- nvidia-smi CSV ------------------------------------------------------------------------------

def test_the_h100_csv_parses_into_typed_values():
    rows = smi_rows("h100x8_query_gpu.csv")
    assert len(rows) == 8
    first = rows[0]
    assert first["uuid"] == "GPU-8a3c1f0e-5b2d-4e6f-9a71-0c4d2e8b6f13"
    assert (first["memory.total"], first["memory.used"], first["power.draw"]) == (81559, 71234, 652.31)
    assert (first["persistence_mode"], first["mig.mode.current"]) == (1, 0)


def test_a_row_with_the_wrong_number_of_fields_is_a_clear_error():
    with pytest.raises(ValueError, match="printed 3 fields where 11 were asked"):
        compare.parse_smi_csv("GPU-x, 1, 2\n", compare.SMI_GPU_QUERY)


def test_n_a_and_not_supported_cells_are_missing_values():
    assert [compare.smi_value(c) for c in ("[N/A]", "[Not Supported]", " 42 ", "Enabled", "Disabled")] == \
        [None, None, 42, 1, 0]


# ---- NVML fields vs nvidia-smi -------------------------------------------------------------------

def test_equal_figures_pass_every_field_of_all_eight_h100s():
    for i, row in enumerate(smi_rows("h100x8_query_gpu.csv")):
        got = compare.compare_gpu(f"GPU {i}", h100_ours(row), row)
        assert {v.status for v in got} == {"ok"}, got
        assert any("tolerance ±32 MiB" in v.detail for v in got)  # the tolerance is stated


def test_each_field_fails_just_outside_its_tolerance_and_passes_inside():
    row = smi_rows("h100x8_query_gpu.csv")[0]  # 71234 MiB used, 652.31 W, 1980 MHz
    cases = [("mem_used_mib", 71234 + 31, 71234 + 33, "memory.used"),
             ("power_w", 652.31 * 1.09, 652.31 * 1.11, "power.draw"),
             ("sm_clock_mhz", 1980 * 1.04, 1980 * 1.06, "clocks.sm"),
             ("temp_c", 67 + 2, 67 + 3, "temperature.gpu"),
             ("gpu_util_pct", 98 - 10, 98 - 11, "utilization.gpu"),
             ("persistence", 1, 0, "persistence_mode")]
    for key, inside, outside, smi in cases:
        assert statuses(compare.compare_gpu("GPU 0", h100_ours(row, **{key: inside}), row))[f"GPU 0 {smi}"] == "ok"
        bad = [v for v in compare.compare_gpu("GPU 0", h100_ours(row, **{key: outside}), row)
               if v.name == f"GPU 0 {smi}"][0]
        assert bad.status == "FAIL" and "nvidia-smi" in bad.detail, (key, bad)


def test_an_a100_with_mig_skips_what_neither_side_reports_and_fails_what_only_one_does():
    row = smi_rows("a100_mig_query_gpu.csv")[0]
    ours = h100_ours(row)  # utilisation None on both sides: NVML reports none under MIG either
    got = statuses(compare.compare_gpu("GPU 0", ours, row))
    assert got["GPU 0 utilization.gpu"] == "skipped" and got["GPU 0 mig.mode.current"] == "ok"
    got = statuses(compare.compare_gpu("GPU 0", dict(ours, mig_mode=None), row))
    assert got["GPU 0 mig.mode.current"] == "FAIL"


def fake_smi_csv(nvml, overrides: dict | None = None) -> str:
    """nvidia-smi's CSV for the fake's GPUs, read straight from the fake's NVML calls."""
    lines = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        mem = nvml.nvmlDeviceGetMemoryInfo(h, nvml.nvmlMemory_v2)
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        cells = {"uuid": nvml.nvmlDeviceGetUUID(h), "memory.total": mem.total // MiB,
                 "memory.used": mem.used // MiB, "utilization.gpu": util.gpu,
                 "utilization.memory": util.memory, "temperature.gpu": nvml.nvmlDeviceGetTemperature(h, 0),
                 "power.draw": nvml.nvmlDeviceGetPowerUsage(h) / 1000,
                 "clocks.sm": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                 "clocks.mem": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
                 "persistence_mode": "[N/A]", "mig.mode.current": "Disabled"}
        cells.update((overrides or {}).get(i, {}))
        lines.append(", ".join(str(cells[n]) for n in compare.SMI_GPU_QUERY.split(",")))
    return "\n".join(lines) + "\n"


def fake_env(nvml, smi: dict, tmp_path) -> selftest.Env:
    """An Env whose nvidia-smi answers from `smi` (first argument -> text)."""
    return selftest.Env(nvml=lambda: nvml, smi=lambda args: smi.get(args[0].split("=")[0]),
                        progress=lambda line: None, scratch=tmp_path, user="alice")


def test_check_nvml_matches_gpus_by_uuid_and_converts_units(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=2, procs_per_gpu=1, clock=lambda: 1_000_000.0)
    collector = NvmlCollector(nvml)
    env = fake_env(nvml, {"--query-gpu": fake_smi_csv(nvml)}, tmp_path)
    try:
        got = selftest.check_nvml(env, collector)
    finally:
        collector.close()
    assert {v.status for v in got} == {"ok", "skipped"}, got
    assert statuses(got)["GPU 1 power.draw"] == "ok"
    assert statuses(got)["GPU 0 persistence_mode"] == "skipped"  # the fake has no persistence call


def test_check_nvml_fails_a_gpu_whose_memory_nvidia_smi_sees_differently(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=2, procs_per_gpu=1, clock=lambda: 1_000_000.0)
    collector = NvmlCollector(nvml)
    used = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(1), nvml.nvmlMemory_v2).used // MiB
    env = fake_env(nvml, {"--query-gpu": fake_smi_csv(nvml, {1: {"memory.used": used + 2048}})}, tmp_path)
    try:
        got = statuses(selftest.check_nvml(env, collector))
    finally:
        collector.close()
    assert got["GPU 1 memory.used"] == "FAIL" and got["GPU 0 memory.used"] == "ok"


# ---- processes ------------------------------------------------------------------------------------

H100_0 = "GPU-8a3c1f0e-5b2d-4e6f-9a71-0c4d2e8b6f13"


def test_a_process_nvidia_smi_lists_with_the_same_memory_passes():
    apps = smi_rows("h100x8_compute_apps.csv", compare.SMI_APPS_QUERY)
    got = compare.compare_process(181734, H100_0, 71224 * MiB, "alice", "alice", apps, 1024 * MiB)
    assert {v.status for v in got} == {"ok"}, got


def test_wrong_memory_user_or_a_missing_pid_fail():
    apps = smi_rows("h100x8_compute_apps.csv", compare.SMI_APPS_QUERY)
    got = statuses(compare.compare_process(181734, H100_0, 70000 * MiB, "bob", "alice", apps, 1024 * MiB))
    assert got["process memory"] == "FAIL" and got["process user"] == "FAIL"
    got = statuses(compare.compare_process(181734, H100_0, None, None, "alice", apps, 1024 * MiB))
    assert got["process pid"] == "FAIL"
    got = statuses(compare.compare_process(999, H100_0, 2048 * MiB, "alice", "alice", apps, 1024 * MiB))
    assert got["process seen by nvidia-smi"] == "FAIL"


def test_a_container_where_nvidia_smi_lists_no_processes_is_skipped_not_failed():
    apps = smi_rows("a100_mig_compute_apps.csv", compare.SMI_APPS_QUERY)
    got = statuses(compare.compare_process(42, "GPU-x", 1100 * MiB, "alice", "alice", apps, 1024 * MiB))
    assert got["process seen by nvidia-smi"] == "skipped" and got["process memory"] == "ok"


def test_check_processes_reads_the_pid_user_and_memory_through_the_fake_nvml(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=2, procs={1: [os.getpid()]})
    collector = NvmlCollector(nvml)
    uuid = collector.static[1].uuid
    mem = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(1))[0].usedGpuMemory
    apps = f"{os.getpid()}, {uuid}, {mem // MiB}\n"
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    env = selftest.Env(nvml=lambda: nvml, smi=lambda args: apps, progress=lambda line: None,
                       scratch=tmp_path, user=me)
    try:
        got = selftest.check_processes(env, collector, os.getpid(), min(mem, 1024 * MiB), uuid)
    finally:
        collector.close()
    assert {v.status for v in got} == {"ok"}, got


# ---- step timing, OOM, allocator, profiler --------------------------------------------------------

def test_step_times_within_two_percent_pass_and_three_percent_fail():
    wall = [10.0, 10.2, 9.9, 10.1]
    assert compare.compare_step_times([w * 1.015 for w in wall], wall).status == "ok"
    assert compare.compare_step_times([w * 1.03 for w in wall], wall).status == "FAIL"
    assert compare.compare_step_times(wall[:3], wall).status == "FAIL"  # a step went missing


def test_a_tracked_loop_slower_than_the_untracked_one_or_a_synchronize_fails():
    assert compare.compare_loop_times(1.04, 1.0, 0).status == "ok"
    assert compare.compare_loop_times(1.10, 1.0, 0).status == "FAIL"
    assert compare.compare_loop_times(1.0, 1.0, 1).status == "FAIL"


def test_the_oom_length_overflows_free_memory_and_the_advised_length_fits_it():
    free, batch, heads, nbytes = 139 * 1024 ** 3, 1, 16, 2
    seq_len = compare.attention_oom_length(free, batch, heads, nbytes)
    requested = batch * heads * seq_len ** 2 * nbytes
    assert requested > free
    pm = {"kind": "gpu", "requested_bytes": requested, "free_bytes": free, "total_bytes": 141 * 1024 ** 3,
          "reserved_bytes": 2 * MiB, "allocated_bytes": 2 * MiB, "phase": "forward"}
    config = {"attn": "naive", "batch": batch, "heads": heads, "seq_len": seq_len, "precision": "bf16"}
    advice = [a.as_dict() for a in advise(pm, config)]
    fits = compare.advised_length(advice)
    assert fits is not None and batch * heads * fits ** 2 * nbytes <= free < batch * heads * (fits + 1) ** 2 * nbytes
    assert {v.status for v in compare.compare_oom(pm, batch, heads, seq_len, nbytes, free, 2 * MiB)} == {"ok"}


def test_an_oom_postmortem_with_wrong_figures_fails_each_one():
    pm = {"requested_bytes": 1000 * MiB, "free_bytes": 500 * MiB, "reserved_bytes": 300 * MiB, "phase": "backward"}
    got = statuses(compare.compare_oom(pm, 1, 16, 8192, 2, free_now=400 * MiB, reserved_now=300 * MiB))
    assert got == {"OOM requested": "FAIL", "OOM free": "FAIL", "OOM reserved": "ok", "OOM phase": "FAIL"}


def test_probe_lines_are_judged():
    from gpuwatch.client.torch_stats import STORED_STATS_KEYS

    line = {"probe": "memory_stats", "keys": ["num_ooms", "num_alloc_retries"], "stored": list(STORED_STATS_KEYS)}
    (v,) = selftest.judge_probe(line)
    assert v.status == "FAIL" and "inactive_split_bytes.all.current" in v.detail
    ops = [{"name": "aten::mm", "device_total_us": 812.5}, {"name": "aten::tanh", "device_total_us": 40.0}]
    assert selftest.judge_probe({"probe": "profiler", "ops": ops})[0].status == "ok"
    ops[0]["device_total_us"] = None  # a window that recorded no CUDA activity
    assert selftest.judge_probe({"probe": "profiler", "ops": ops})[0].status == "FAIL"
    assert selftest.judge_probe({"probe": "oom_fits", "seq_len": 93000, "fits": False,
                                 "error": "CUDA out of memory"})[0].status == "FAIL"


# ---- MIG and the sampler's PCIe job ----------------------------------------------------------------

def test_nvidia_smi_L_counts_mig_devices_per_gpu():
    assert compare.mig_devices_by_gpu((DATA / "a100_mig_L.txt").read_text()) == {
        "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77": 3}
    assert set(compare.mig_devices_by_gpu((DATA / "h100x8_L.txt").read_text()).values()) == {0}


def test_mig_is_skipped_with_a_reason_where_it_is_off(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=2)
    collector = NvmlCollector(nvml)
    try:
        (v,) = selftest.check_mig(fake_env(nvml, {}, tmp_path), collector)
    finally:
        collector.close()
    assert v.status == "skipped" and "not enabled" in v.detail


def slow_pcie(nvml, seconds: float):
    real = nvml.nvmlDeviceGetPcieThroughput

    def call(device, counter):
        time.sleep(seconds)
        return real(device, counter)
    nvml.nvmlDeviceGetPcieThroughput = call


def test_pcie_counters_that_cost_most_of_a_tick_move_to_their_own_job():
    assert pcie_too_costly(0.16, 0.2) and not pcie_too_costly(0.01, 0.2)
    nvml = fake_pynvml.FakeNvml(gpus=4, procs_per_gpu=1)
    slow_pcie(nvml, 0.005)  # NVIDIA documents ~20 ms per call on real drivers
    collector = NvmlCollector(nvml)
    try:
        for tick in range(PCIE_DECIDE_TICKS - 1):
            collector.sample(tick)
        assert not collector.pcie_separate  # decided on several ticks, not the first
        collector.sample(999)
        assert collector.pcie_separate
        nvml.calls.clear()
        gpus, _ = collector.sample(2000)
        assert nvml.calls["nvmlDeviceGetPcieThroughput"] == 0 and gpus[0].pcie_tx_kbps is None
        collector.sample_pcie()  # the sampler's slower job
        gpus, _ = collector.sample(3000)
        assert gpus[0].pcie_tx_kbps is not None and nvml.calls["nvmlDeviceGetPcieThroughput"] == 8
    finally:
        collector.close()


def test_cheap_pcie_counters_stay_in_the_tick_and_selftest_reports_the_share(tmp_path):
    nvml = fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=1)
    collector = NvmlCollector(nvml)
    try:
        (v,) = selftest.check_sampling_cost(fake_env(nvml, {}, tmp_path), collector)
        assert not collector.pcie_separate
    finally:
        collector.close()
    assert v.status == "ok" and "kept in the tick" in v.detail and "(8 GPUs)" in v.name


# ---- the command ------------------------------------------------------------------------------------

def test_without_a_gpu_the_command_runs_the_host_checks_and_skips_the_rest_with_why():
    result = CliRunner().invoke(main, ["selftest", "--json", "--quick"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    by_name = {c["name"]: c for c in got["checks"]}
    assert got["ok"] and by_name["database"]["status"] == "ok"
    assert by_name["daemon round trip"]["status"] == "ok", by_name["daemon round trip"]
    assert by_name["CUDA checks"]["status"] == "skipped" and "NVML" in by_name["CUDA checks"]["detail"]


def test_a_failed_check_makes_the_command_exit_non_zero(monkeypatch):
    monkeypatch.setattr(selftest, "check_host", lambda env: [compare.Verdict("host memory total", "FAIL", "x")])
    result = CliRunner().invoke(main, ["selftest"])
    assert result.exit_code == 1 and "FAIL" in result.output and "1 failed" in result.output


def test_the_cuda_probe_says_why_it_is_skipped_where_torch_sees_no_gpu(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the probe runs for real (tests marked gpu)")
    (v,) = selftest._probe_checks(fake_env(None, {}, tmp_path), collector=None)
    assert v.status == "skipped" and "torch.cuda.is_available() is False" in v.detail



def test_the_probe_process_must_be_stored_linked_to_its_run(tmp_path):
    from gpuwatch.store import open_rw

    conn = open_rw(tmp_path / "probe.db")
    conn.execute("INSERT INTO processes (pid, start_ms, run_id, first_seen_ms, last_seen_ms) "
                 "VALUES (4242, 1, 'run-abcdef12', 1, 1)")
    conn.commit()
    conn.close()
    env = fake_env(None, {}, tmp_path)
    assert selftest._run_linked(env, "run-abcdef12", 4242)[0].status == "ok"
    assert selftest._run_linked(env, "run-abcdef12", 4343, wait_s=0.5)[0].status == "FAIL"

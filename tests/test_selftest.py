"""`gpuwatch selftest`: every comparison against recorded nvidia-smi output and the fake NVML, and
the command on this GPU-less machine (host checks run, GPU checks skipped with why)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import fake_pynvml
import pytest

from collectors import nvml as nvml_mod
from collectors.nvml import GpuSample, GpuStatic, NvmlCollector
from gpuwatch.selftest import cuda, smi
from gpuwatch.selftest.result import FAIL, OK, SKIPPED

DATA = Path(__file__).parent / "data"
GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
MiB = 2**20
H100_ROWS = smi.parse_csv((DATA / "nvidia_smi_h100x8.csv").read_text(), smi.QUERY)


def _static(i: int, uuid: str, mig_mode=None) -> GpuStatic:
    return GpuStatic(i, uuid, "NVIDIA H100 80GB HBM3", None, 81559 * MiB, 700_000, mig_mode, "550.54", "12.4")


def _sample(i: int, row: dict, **changes) -> GpuSample:
    """What NVML would have said a moment after nvidia-smi's row."""
    fields = dict(
        gpu_index=i,
        ts_ms=0,
        gpu_util_pct=int(row["utilization.gpu"]),
        mem_used_bytes=int(row["memory.used"] * MiB),
        temp_c=int(row["temperature.gpu"]),
        power_mw=int(row["power.draw"] * 1000),
        sm_clock_mhz=int(row["clocks.sm"]),
        mem_clock_mhz=int(row["clocks.mem"]),
    )
    fields.update(changes)
    return GpuSample(**fields)


def test_recorded_nvidia_smi_csv_parses_into_numbers_flags_and_none():
    assert len(H100_ROWS) == 8
    first = H100_ROWS[0]
    assert first["uuid"].startswith("GPU-0c1d5a9e") and first["memory.total"] == 81559.0
    assert (first["persistence_mode"], first["mig.mode.current"], first["power.draw"]) == (1, None, 512.35)
    (a100,) = smi.parse_csv((DATA / "nvidia_smi_a100_mig.csv").read_text(), smi.QUERY)
    assert a100["utilization.gpu"] is None and a100["mig.mode.current"] == 1  # no utilisation on MIG


def test_eight_h100s_agreeing_within_tolerance_are_all_ok():
    statics = [_static(i, r["uuid"]) for i, r in enumerate(H100_ROWS)]
    # Figures a moment later: a little more memory, a point of utilisation, a degree, some watts.
    samples = [
        _sample(
            i,
            r,
            mem_used_bytes=int((r["memory.used"] + 100) * MiB),
            temp_c=int(r["temperature.gpu"]) + 1,
            power_mw=int(r["power.draw"] * 1000) + 8000,
        )
        for i, r in enumerate(H100_ROWS)
    ]
    results = smi.compare(samples, statics, {i: 1 for i in range(8)}, H100_ROWS)
    assert len(results) == 8 * len(smi.FIELDS)
    assert {r.status for r in results} == {OK}, [r for r in results if r.status != OK]
    tolerances = {r.check.split(" ", 2)[2]: r.tolerance for r in results if r.check.startswith("GPU 0 ")}
    assert tolerances["memory.used"] == "256 MiB or 2 %" and tolerances["temperature.gpu"] == "3 °C"


def test_a_wrong_field_fails_naming_the_gpu_field_and_both_figures():
    statics = [_static(i, r["uuid"]) for i, r in enumerate(H100_ROWS)]
    samples = [_sample(i, r) for i, r in enumerate(H100_ROWS)]
    samples[3] = _sample(3, H100_ROWS[3], mem_used_bytes=20_000 * MiB)  # half of what nvidia-smi says
    samples[5] = _sample(5, H100_ROWS[5], power_mw=None)  # gpuwatch lost a field nvidia-smi has
    failed = [
        r for r in smi.compare(samples, statics, {i: 1 for i in range(8)}, H100_ROWS) if r.status == FAIL
    ]
    assert [r.check for r in failed] == ["GPU 3 memory.used", "GPU 5 power.draw"]
    assert "gpuwatch 20000 MiB vs 40960" in failed[0].detail or "gpuwatch 2e+04" not in failed[0].detail
    assert "one side has no value" in failed[1].detail


def test_a_gpu_nvidia_smi_lists_but_gpuwatch_does_not_fails():
    statics = [_static(0, H100_ROWS[0]["uuid"])]
    results = smi.compare([_sample(0, H100_ROWS[0])], statics, {0: 1}, H100_ROWS[:2])
    assert results[-1].status == FAIL and "gpuwatch does not" in results[-1].detail


def test_the_collector_on_the_fake_nvml_agrees_with_a_listing_made_from_it():
    fake = fake_pynvml.FakeNvml(gpus=2, clock=lambda: 1_000_000.0)
    collector = NvmlCollector(fake)
    samples, _ = collector.sample(0)
    rows = [
        {
            "uuid": g.uuid,
            "memory.total": g.mem_total_bytes / MiB,
            "memory.used": s.mem_used_bytes / MiB,
            "utilization.gpu": s.gpu_util_pct,
            "temperature.gpu": s.temp_c,
            "power.draw": s.power_mw / 1000,
            "clocks.sm": s.sm_clock_mhz,
            "clocks.mem": s.mem_clock_mhz,
            "persistence_mode": 1,
            "mig.mode.current": g.mig_mode,
        }
        for g, s in zip(collector.static, samples)
    ]
    persistence = {g.gpu_index: collector.persistence_mode(g.gpu_index) for g in collector.static}
    assert persistence == {0: 1, 1: 1}
    assert {r.status for r in smi.compare(samples, collector.static, persistence, rows)} == {OK}
    rows[1]["temperature.gpu"] += 10
    assert [
        r.check for r in smi.compare(samples, collector.static, persistence, rows) if r.status == FAIL
    ] == ["GPU 1 temperature.gpu"]


def test_slow_pcie_reads_move_to_their_own_slower_cadence(monkeypatch):
    fake = fake_pynvml.FakeNvml(gpus=2)
    real = fake.nvmlDeviceGetPcieThroughput

    def slow(handle, counter):  # as NVIDIA documents it: each read samples for ~20 ms
        time.sleep(0.02)
        return real(handle, counter)

    fake.nvmlDeviceGetPcieThroughput = slow
    collector = NvmlCollector(fake)
    first, _ = collector.sample(0)
    # GPUs are read side by side: the PCIe time that holds a tick back is one GPU's two reads.
    assert collector.pcie_every == nvml_mod.PCIE_SLOW_EVERY and collector.last_pcie_ms >= 40
    reads = fake.calls["nvmlDeviceGetPcieThroughput"]
    ticks = [collector.sample(t)[0] for t in range(1, 2 * nvml_mod.PCIE_SLOW_EVERY)]
    # Of the 19 ticks that follow only the 10th and 20th read PCIe (2 GPUs, tx and rx each).
    assert fake.calls["nvmlDeviceGetPcieThroughput"] - reads == 2 * 2 * 2
    assert all(s.pcie_tx_kbps is not None for tick in ticks for s in tick)  # the last values meanwhile
    verdict = smi.tick_verdict(collector.last_tick_ms, 80.0, collector.pcie_every, 2)
    assert "moved to every 10th tick" in verdict.detail


def test_fast_pcie_reads_stay_in_every_tick():
    collector = NvmlCollector(fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=4))
    for t in range(3):
        collector.sample(t)
    assert collector.pcie_every == 1
    assert smi.tick_verdict(collector.last_tick_ms, collector.last_pcie_ms, 1, 8).status == OK
    assert smi.tick_verdict(250.0, 10.0, 1, 8).status == FAIL


def test_step_timing_and_sync_comparisons():
    assert cuda.timing_agreement(1010.0, 1000.0).status == OK
    assert cuda.timing_agreement(1030.0, 1000.0).status == FAIL
    assert cuda.no_extra_sync(1.015, 1.0).status == OK
    assert cuda.no_extra_sync(1.2, 1.0).status == FAIL  # a sync per step costs the run-ahead


def test_oom_arithmetic_postmortem_and_advice():
    free, total = 70 * 2**30, 80 * 2**30
    length = cuda.oom_length(free, batch=2, heads=4)
    assert cuda.scores_bytes(2, 4, length) > 1.49 * free and cuda.scores_bytes(2, 4, length - 2) < 1.51 * free
    expected = cuda.scores_bytes(2, 4, length)
    pm = {
        "requested_bytes": expected,
        "total_bytes": total,
        "free_bytes": free - 2**30,
        "reserved_bytes": 2**30,
        "phase": "forward",
    }
    at_oom = {"free_bytes": free - 2**30 + 3 * MiB, "reserved_bytes": 2**30}  # torch's own, read just after
    assert {r.status for r in cuda.oom_verdict(pm, expected, total, at_oom)} == {OK}
    wrong = dict(pm, requested_bytes=expected // 2, phase="backward", free_bytes=free)
    assert [r.status for r in cuda.oom_verdict(wrong, expected, total, at_oom)] == [FAIL, OK, FAIL, OK, FAIL]
    # A workload that printed no figures: the free/reserved comparisons fail, saying which side is missing.
    missing = cuda.oom_verdict(pm, expected, total, {})
    assert [r.status for r in missing] == [OK, OK, FAIL, FAIL, OK] and "one side has no value" in missing[
        2
    ].detail
    advice = [
        {
            "title": "Naive attention",
            "detail": "naive attention needs 140.0 GiB for the B·H·L² score "
            "tensor at L=123456 …; or L ≤ 101234 fits the 70.0 GiB that was free",
        }
    ]
    assert cuda.fits_length(advice) == 101234 and cuda.fits_length([{"detail": "use bf16"}]) is None


def test_allocator_keys_profiler_process_and_mig_comparisons():
    assert cuda.stats_keys(list(cuda.STATS_KEYS) + ["active.all.current"]).status == OK
    missing = cuda.stats_keys(["num_ooms"])
    assert missing.status == FAIL and "num_alloc_retries" in missing.detail
    assert cuda.profiler_verdict([("aten::mm", 812.0), ("aten::add", 3.0)]).status == OK
    assert cuda.profiler_verdict([("aten::mm", 0.0), ("aten::addmm", None)]).status == FAIL

    from collectors.nvml import GpuProcessSample

    ours = [
        GpuProcessSample(
            gpu_index=2,
            pid=4242,
            ts_ms=0,
            kind="compute",
            used_mem_bytes=530 * MiB,
            sm_util_pct=None,
            mem_util_pct=None,
        )
    ]
    rows = [{"pid": 4242.0, "used_memory": 532.0}, {"pid": 99.0, "used_memory": 1000.0}]
    assert {r.status for r in cuda.process_verdict(4242, "alice", ours, rows, True)} == {OK}
    assert cuda.process_verdict(4243, "alice", ours, rows, True)[0].status == FAIL
    assert cuda.process_verdict(4242, "alice", ours, rows, False)[-1].status == FAIL

    listed = cuda.mig_devices_from_list((DATA / "nvidia_smi_L_a100_mig.txt").read_text())
    assert len(listed) == 3 and listed[0].startswith("MIG-5f1b2c3d")
    assert cuda.mig_verdict(listed, listed).status == OK
    assert cuda.mig_verdict(listed[:2], listed).status == FAIL


def test_selftest_here_runs_the_host_checks_and_skips_the_gpu_ones_with_why():
    done = subprocess.run(
        [GPUWATCH, "selftest", "--quick", "--json"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = {r["check"]: r for r in json.loads(done.stdout)}
    for check in ("host memory total", "database round trip", "daemon socket round trip"):
        assert results[check]["status"] == OK, results[check]
    assert results["py-spy stack dump"]["status"] in (OK, SKIPPED)  # skipped only without ptrace rights
    assert (
        results["NVML vs nvidia-smi"]["status"] == SKIPPED
        and "driver" in results["NVML vs nvidia-smi"]["detail"]
    )
    assert results["step timing"]["status"] == SKIPPED and results["step timing"]["detail"]
    gpm = results["GPM SM activity under a known load"]
    assert gpm["status"] == SKIPPED and "NVML unavailable" in gpm["detail"]
    assert "checking daemon socket" in done.stderr  # progress, on stderr


@pytest.mark.gpu
def test_selftest_on_a_real_gpu_has_no_failures():
    done = subprocess.run([GPUWATCH, "selftest", "--json"], capture_output=True, text=True, timeout=600)
    results = json.loads(done.stdout)
    assert done.returncode == 0, [r for r in results if r["status"] == FAIL]
    assert any(r["check"].startswith("GPU 0 ") and r["status"] == OK for r in results)


def test_gpm_verdict_against_a_known_load():
    from collectors.nvml import GpuProfSample
    from gpuwatch.selftest import gpm

    idle = GpuProfSample(0, 0, sm_active_pct=2.0, tensor_active_pct=0.0)
    busy = GpuProfSample(
        0, 1, sm_active_pct=97.0, sm_occupancy_pct=30.0, tensor_active_pct=55.0, dram_active_pct=20.0
    )
    assert [r.status for r in gpm.gpm_verdict("GPU 0 H100", idle, busy)] == [OK, OK]
    lazy = GpuProfSample(0, 1, sm_active_pct=35.0, tensor_active_pct=0.0)
    failed = [r for r in gpm.gpm_verdict("GPU 0 H100", idle, lazy) if r.status == FAIL]
    assert len(failed) == 2 and "SM active 35 %" in failed[0].detail
    assert gpm.gpm_verdict("GPU 0 H100", idle, None)[0].status == FAIL
    assert gpm.gpm_verdict("GPU 0 H100", busy, lazy)[-1].check == "GPM SM activity: busy above idle"


def test_gpm_check_skips_with_why_where_no_gpu_has_gpm():
    from gpuwatch.selftest import gpm

    (result,) = gpm._measure(NvmlCollector(fake_pynvml.FakeNvml(gpus=2, procs_per_gpu=1)))
    assert result.status == SKIPPED and "no GPU here has GPM" in result.detail


@pytest.mark.gpu
def test_gpm_on_a_real_gpu_follows_a_known_load():
    from gpuwatch.selftest import gpm

    results = gpm.check()
    assert not [r for r in results if r.status == FAIL], results

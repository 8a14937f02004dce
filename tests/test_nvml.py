"""NvmlCollector against the fake pynvml (8 simulated GPUs), and once against a real driver."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import fake_pynvml
import pytest

from collectors.nvml import GpuProcessSample, GpuSample, GpuStatic, NvmlCollector, NvmlUnavailable, XidEvent
from gpuwatch.store import insert_rows, open_rw

GPU_FIELDS = [f.name for f in dataclasses.fields(GpuSample)]
VALUE_FIELDS = [f for f in GPU_FIELDS if f not in ("gpu_index", "ts_ms", "state")]


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def collector(**options):
    fake = fake_pynvml.FakeNvml(**options)
    return fake, NvmlCollector(fake)


def test_eight_gpus_every_field_present_and_typed():
    fake, c = collector(gpus=8, procs_per_gpu=2)
    gpus, procs = c.sample(1234)
    assert [g.gpu_index for g in gpus] == list(range(8))
    for g in gpus:
        assert g.ts_ms == 1234 and g.state is None
        for name in VALUE_FIELDS:
            assert isinstance(getattr(g, name), int), (name, getattr(g, name))
        assert g.mem_used_bytes + g.mem_free_bytes + g.mem_reserved_bytes == 80 * fake_pynvml.GiB
        assert 0 <= g.gpu_util_pct <= 100
    assert len(procs) == 16 and all(p.kind == "compute" and p.used_mem_bytes > 0 for p in procs)
    assert len({s.uuid for s in c.static}) == 8
    s = c.static[5]
    assert s.name.endswith("(simulated)") and s.pci_bus_id.startswith("00000000:")
    assert (s.mem_total_bytes, s.power_limit_mw, s.mig_mode) == (80 * fake_pynvml.GiB, 700_000, 0)
    assert (s.driver_version, s.cuda_driver_version) == ("550.54.15", "12.4")


def test_records_go_straight_into_their_tables(tmp_path):
    """Field names are the schema's column names: asdict rows insert without renaming."""
    fake, c = collector(gpus=2, procs_per_gpu=1, xids={1: [48]})
    gpus, procs = c.sample(1000)
    conn = open_rw(tmp_path / "t.db")
    now = {"first_seen_ms": 1000, "last_seen_ms": 1000}
    insert_rows(conn, "gpus", [dataclasses.asdict(s) | now for s in c.static])
    insert_rows(conn, "gpu_samples", [dataclasses.asdict(g) for g in gpus])
    insert_rows(conn, "gpu_process_samples", [dataclasses.asdict(p) for p in procs])
    insert_rows(conn, "xid_events", [dataclasses.asdict(x) for x in c.xid_events(1000)])
    assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == 2
    assert conn.execute("SELECT xid FROM xid_events WHERE gpu_index = 1").fetchone()[0] == 48
    assert conn.execute("SELECT name FROM gpus WHERE gpu_index = 0").fetchone()[0].endswith("(simulated)")


def test_not_supported_fields_are_none_and_the_rest_kept():
    unsupported = {"nvmlDeviceGetFanSpeed", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieThroughput"}
    fake, c = collector(gpus=8, procs_per_gpu=1, unsupported={2: unsupported})
    gpus, _ = c.sample(1000)
    lost = {"fan_pct", "ecc_corrected", "ecc_uncorrected", "pcie_tx_kbps", "pcie_rx_kbps"}
    for name in VALUE_FIELDS:
        assert (getattr(gpus[2], name) is None) == (name in lost), name
        assert getattr(gpus[3], name) is not None, name
    assert gpus[2].state is None


def test_an_unsupported_field_is_not_asked_again():
    fake, c = collector(gpus=8, unsupported={"nvmlDeviceGetFanSpeed"})
    for t in range(5):
        c.sample(1000 + t)
    assert fake.calls["nvmlDeviceGetFanSpeed"] == 8
    assert fake.calls["nvmlDeviceGetTemperature"] == 40


def test_static_fields_are_read_once():
    fake, c = collector(gpus=8, procs_per_gpu=1)
    for t in range(5):
        c.sample(1000 + t)
    for fn in (
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetEnforcedPowerLimit",
    ):
        assert fake.calls[fn] == 8, fn
    assert fake.calls["nvmlSystemGetDriverVersion"] == 1
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 40


def test_a_lost_gpu_is_marked_lost_and_the_others_keep_sampling():
    fake, c = collector(gpus=8, procs_per_gpu=1)
    c.sample(1000)
    fake.set_lost(3)
    for t in (2000, 3000):
        gpus, procs = c.sample(t)
        assert len(gpus) == 8
        assert gpus[3] == GpuSample(3, t, state="lost")
        assert all(g.state is None and g.gpu_util_pct is not None for g in gpus if g.gpu_index != 3)
        assert sorted({p.gpu_index for p in procs}) == [0, 1, 2, 4, 5, 6, 7]
    # While lost it costs at most two calls a tick (handle + uuid), not a full sample.
    before = sum(n for (fn, i), n in fake.gpu_calls.items() if i == 3)
    c.sample(4000)
    assert sum(n for (fn, i), n in fake.gpu_calls.items() if i == 3) - before <= 2
    fake.set_lost(3, False)
    gpus, _ = c.sample(5000)
    assert gpus[3].state is None and gpus[3].temp_c is not None


def test_gpu_lost_after_some_calls_mid_tick():
    fake, c = collector(gpus=8, procs_per_gpu=1, lost_after={6: 40})
    states = [c.sample(1000 + t)[0][6].state for t in range(4)]
    assert states[0] is None and states[-1] == "lost"


def test_library_missing_gives_one_readable_line():
    with pytest.raises(NvmlUnavailable) as e:
        NvmlCollector(fake_pynvml.FakeNvml(init_error="LibraryNotFound"))
    assert "libnvidia-ml.so.1 was not found" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(NvmlUnavailable, match="kernel driver is not loaded"):
        NvmlCollector(fake_pynvml.FakeNvml(init_error="DriverNotLoaded"))


def test_default_module_is_pynvml(monkeypatch):
    """With no argument the collector imports `pynvml`; here the module-level fake stands in."""
    fake = fake_pynvml.configure(gpus=3)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    c = NvmlCollector()
    assert len(c.sample(1)[0]) == 3 and fake.calls["nvmlInit"] == 1
    c.close()
    assert fake.initialized is False


def test_process_utilisation_carries_the_last_seen_timestamp():
    clock = Clock()
    fake, c = collector(gpus=1, procs_per_gpu=2, clock=clock)
    first = c.sample(int(clock.t * 1000))[1]
    assert all(p.sm_util_pct is not None for p in first)
    newest_us = int(clock.t * 1e6)  # the clock sits on a sample boundary
    clock.t += 1.0  # two new half-second samples per process
    second = c.sample(int(clock.t * 1000))[1]
    assert fake.util_timestamps[0] == [0, newest_us]
    # The mean is over the two fresh samples only, not the older ones still in the buffer.
    fresh = fake.nvmlDeviceGetProcessUtilization(fake_pynvml.FakeHandle(0), newest_us)
    for p in second:
        mine = [s.smUtil for s in fresh if s.pid == p.pid]
        assert len(mine) == 2 and p.sm_util_pct == round(sum(mine) / 2)
    # No new samples: utilisation is unknown, not the previous value counted again.
    third = c.sample(int(clock.t * 1000) + 1)[1]
    assert [p.sm_util_pct for p in third] == [None, None]
    assert [p.used_mem_bytes for p in third] == [p.used_mem_bytes for p in second]


def test_compute_and_graphics_processes_merge_by_pid():
    pid = fake_pynvml.FAKE_PID_BASE + 7
    fake, c = collector(gpus=1, procs={0: [pid]}, graphics_procs={0: [pid, pid + 1]})
    procs = {p.pid: p for p in c.sample(1000)[1]}
    assert procs[pid].kind == "compute+graphics" and procs[pid].used_mem_bytes == fake._proc_mem(pid)
    assert procs[pid + 1].kind == "graphics" and procs[pid + 1].used_mem_bytes is None


def test_processes_that_vanish_drop_out():
    fake, c = collector(gpus=2, procs_per_gpu=3)
    assert len(c.sample(1000)[1]) == 6
    fake.set_procs(0, [fake_pynvml.FAKE_PID_BASE + 1])
    procs = c.sample(2000)[1]
    assert sorted((p.gpu_index, p.pid) for p in procs) == [(0, fake_pynvml.FAKE_PID_BASE + 1)] + [
        (1, fake_pynvml.FAKE_PID_BASE + 100 + k) for k in range(3)
    ]
    assert all(isinstance(p, GpuProcessSample) for p in procs)


def test_old_driver_memory_v1_and_throttle_reason_fallbacks():
    fake, c = collector(
        gpus=2, procs_per_gpu=1, memory_v2=False, unsupported={"nvmlDeviceGetCurrentClocksEventReasons"}
    )
    for t in range(3):
        g = c.sample(1000 + t)[0][0]
    assert g.mem_reserved_bytes is None and g.mem_used_bytes > 0
    assert g.throttle_reasons is not None
    # Each GPU tried v2 once (plus the static read, v1), then v1 only.
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 2 + 2 + 3 * 2
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 2


def test_xid_events_are_polled_without_waiting():
    fake, c = collector(gpus=4, xids={1: [13, 79]})
    assert c.xid_events(1000) == [XidEvent(1000, 1, 13), XidEvent(1000, 1, 79)]
    assert c.xid_events(2000) == []
    fake.add_xid(3, 48)
    assert c.xid_events(3000) == [XidEvent(3000, 3, 48)]


def test_collectors_import_no_store_tui_or_torch():
    code = (
        "import sys, collectors.nvml, collectors.host, collectors.processes; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'torch') "
        "or m.startswith('gpuwatch.store') or m.startswith('gpuwatch.tui')]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.gpu
def test_real_driver():
    c = NvmlCollector()
    try:
        assert c.static and all(isinstance(s, GpuStatic) and s.uuid.startswith("GPU-") for s in c.static)
        gpus, procs = c.sample(1000)
        gpus, procs = c.sample(2000)
        assert len(gpus) == len(c.static)
        for g in gpus:
            assert g.state is None
            assert g.mem_used_bytes is not None and g.temp_c is not None and g.power_mw is not None
        assert all(p.kind in ("compute", "graphics", "compute+graphics") for p in procs)
        assert isinstance(c.xid_events(2000), list)
    finally:
        c.close()


def test_the_fake_matches_the_real_module():
    """Same function names and parameters, same error classes built the same way."""
    import inspect

    import pynvml

    for name in [n for n in vars(fake_pynvml.FakeNvml) if n.startswith("nvml")]:
        real = getattr(pynvml, name)
        fake = list(inspect.signature(getattr(fake_pynvml.FakeNvml, name)).parameters)[1:]
        assert list(inspect.signature(real).parameters) == fake, name
    for module in (pynvml, fake_pynvml):
        err = module.NVMLError(module.NVML_ERROR_NOT_SUPPORTED)
        assert isinstance(err, module.NVMLError_NotSupported) and err.value == 3
        assert module.NVMLError_GpuIsLost().value == module.NVML_ERROR_GPU_IS_LOST
    fake_codes = {n: getattr(fake_pynvml, n) for n in dir(fake_pynvml) if n.startswith("NVML_ERROR_")}
    assert {n: getattr(pynvml, n) for n in fake_codes} == fake_codes
    assert {n for n in dir(fake_pynvml) if n.startswith("NVMLError_")} <= set(dir(pynvml))

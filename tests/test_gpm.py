"""GPM (GPU performance monitoring, Hopper and later) through the fake NVML: SM activity,
occupancy, tensor and DRAM activity sampled per GPU tick, stored, shown beside utilisation in
the overview and exported under DCGM's profiling names; "n/a" and no series where a GPU has
none, and no crash when GPM stops answering mid-run."""

from __future__ import annotations

import sqlite3
import time

import fake_pynvml
import pytest
from test_metrics import samples_by_name, scrape

from collectors.nvml import NvmlCollector
from gpuwatch.base.config import Config
from gpuwatch.daemon.metrics import start_metrics_server
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer
from gpuwatch.tui import panels
from gpuwatch.tui.snapshot import View
from gpuwatch.tui.source import StoreSource

T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.s = T0

    def seconds(self) -> float:
        return self.s

    def ms(self) -> int:
        return int(self.s * 1000)


def hopper_and_older(clock: Clock, **options) -> fake_pynvml.FakeNvml:
    """GPU 0 has GPM (a Hopper), GPU 1 has none (an older GPU); both run a process."""
    return fake_pynvml.FakeNvml(gpus=2, gpm={0}, procs_per_gpu=1, clock=clock.seconds, **options)


def ticks(collector: NvmlCollector, clock: Clock, n: int) -> list:
    out = []
    for _ in range(n):
        collector.sample(clock.ms())
        out.append(collector.sample_gpm(clock.ms()))
        clock.s += 1
    return out


def test_a_hopper_gpu_gets_gpm_figures_over_each_tick_and_an_older_gpu_none():
    clock = Clock()
    fake = hopper_and_older(clock)
    collector = NvmlCollector(fake)
    first, second = ticks(collector, clock, 2)
    assert first == []  # one sample: no interval yet
    (sample,) = second
    util = fake._util(0, T0 + 1)  # the fake's utilisation when the newer sample was taken
    assert sample.gpu_index == 0 and util > 0
    assert sample.sm_active_pct == pytest.approx(0.8 * util, abs=0.01)
    assert sample.sm_occupancy_pct == pytest.approx(0.4 * util, abs=0.01)
    assert sample.tensor_active_pct == pytest.approx(0.5 * util, abs=0.01)
    assert sample.dram_active_pct == pytest.approx(0.3 * util, abs=0.01)
    assert fake.gpm_buffers == 2  # two per GPM GPU, kept from tick to tick
    ticks(collector, clock, 3)
    assert fake.gpm_buffers == 2 and fake.calls["nvmlGpmSampleAlloc"] == 2
    assert fake.gpu_calls["nvmlGpmSampleGet", 1] == 0  # asked once, never again
    collector.close()
    assert fake.gpm_buffers == 0


@pytest.mark.parametrize("refused", ["nvmlGpmSampleGet", "nvmlGpmMetricsGet"])
def test_gpm_refused_mid_run_turns_to_none_and_frees_its_buffers(refused):
    clock = Clock()
    fake = hopper_and_older(clock)
    collector = NvmlCollector(fake)
    assert ticks(collector, clock, 2)[-1]
    fake.unsupported[0].add(refused)
    after = ticks(collector, clock, 3)
    assert after == [[], [], []]
    assert fake.gpm_buffers == 0
    samples, _ = collector.sample(clock.ms())
    assert [s.state for s in samples] == [None, None]  # the GPU itself is still sampled
    collector.close()


def test_a_gpu_lost_mid_run_frees_its_gpm_buffers_and_gets_new_ones_when_back():
    clock = Clock()
    fake = hopper_and_older(clock)
    collector = NvmlCollector(fake)
    assert ticks(collector, clock, 2)[-1]
    fake.set_lost(0)
    assert ticks(collector, clock, 2) == [[], []]
    assert fake.gpm_buffers == 0
    fake.set_lost(0, lost=False)
    back = ticks(collector, clock, 3)
    assert back[0] == [] and [s.gpu_index for s in back[-1]] == [0]
    assert fake.gpm_buffers == 2
    collector.close()
    assert fake.gpm_buffers == 0


def test_gpm_stored_shown_beside_utilisation_and_exported_under_dcgm_names(tmp_path):
    db = str(tmp_path / "gw.db")
    clock = Clock()
    clock.s = time.time()  # fresh: /metrics and the TUI leave out old samples
    writer = Writer(db)
    sampler = Sampler(writer, Config(), nvml_module=hopper_and_older(clock), clock=clock.ms)
    try:
        for _ in range(3):
            sampler.gpu_tick()
            clock.s += 1
        writer.flush()
    finally:
        sampler.nvml.close()
        writer.close()
    conn = sqlite3.connect(db)
    stored = conn.execute(
        "SELECT gpu_index, count(*), min(sm_active_pct), max(tensor_active_pct) "
        "FROM gpu_prof_samples GROUP BY gpu_index"
    ).fetchall()
    newest = conn.execute(
        "SELECT sm_active_pct, tensor_active_pct FROM gpu_prof_samples ORDER BY ts_ms DESC LIMIT 1"
    ).fetchone()
    conn.close()
    assert [(g, n) for g, n, *_ in stored] == [(0, 2)]  # the older GPU has no rows
    assert all(v is not None for row in stored for v in row)

    snap = StoreSource(db, clock=clock.ms).fetch(View("overview"))
    hopper, older = snap.gpus
    assert (hopper.sm_active_pct, hopper.tensor_active_pct) == tuple(newest)
    assert older.sm_active_pct is None and older.tensor_active_pct is None
    assert panels.prof_cell(older, 80).plain.strip() == "n/a"
    assert panels.prof_cell(hopper, 80).plain.strip() == f"{newest[0]:.0f}%"
    wide = panels.gpu_header(160).plain
    assert all(name in wide for name in ("SM", "TENS", "DRAM", "OCC"))

    server = start_metrics_server("127.0.0.1:0", db)
    try:
        metrics = samples_by_name(scrape(server))
    finally:
        server.close()
    for name in (
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
    ):
        (series,) = metrics[name]  # the Hopper GPU only
        assert series.labels["gpu"] == "0" and series.labels["UUID"] and 0 < series.value <= 1
    (sm,) = metrics["DCGM_FI_PROF_SM_ACTIVE"]
    assert sm.value == pytest.approx(newest[0] / 100)
    assert {s.labels["gpu"] for s in metrics["DCGM_FI_DEV_GPU_UTIL"]} == {"0", "1"}


def test_the_sampler_goes_on_when_the_gpm_gpu_is_lost_mid_run(tmp_path):
    db = str(tmp_path / "gw.db")
    clock = Clock()
    fake = hopper_and_older(clock)
    writer = Writer(db)
    sampler = Sampler(writer, Config(), nvml_module=fake, clock=clock.ms)
    try:
        for tick in range(6):
            if tick == 3:
                fake.set_lost(0)
            sampler.gpu_tick()
            clock.s += 1
        writer.flush()
    finally:
        sampler.nvml.close()
        writer.close()
    conn = sqlite3.connect(db)
    prof = conn.execute("SELECT ts_ms FROM gpu_prof_samples ORDER BY ts_ms").fetchall()
    states = conn.execute("SELECT state FROM gpu_samples WHERE gpu_index = 0 ORDER BY ts_ms").fetchall()
    conn.close()
    assert len(prof) == 2 and [s for (s,) in states] == [None] * 3 + ["lost"] * 3
    assert fake.gpm_buffers == 0

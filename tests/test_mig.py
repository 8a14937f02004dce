"""MIG devices end to end: the collector against the fake pynvml's MIG GPUs, the sampler into a
real SQLite file, and what the TUI, `gpuwatch status` and /metrics show; once on a real driver."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
from pathlib import Path

import fake_pynvml
import pytest
from test_daemon import Clock
from test_metrics import scrape
from test_prometheus_integration import (
    _promtool_problems,
    _query,
    _wait_for,
    needs_prometheus,
    prometheus_scraping,
)
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from collectors.nvml import MIG_RESCAN_MS, NvmlCollector
from gpuwatch.base import fmt
from gpuwatch.base.config import Config
from gpuwatch.daemon.metrics import StoreCollector
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer, open_ro, open_rw, queries
from gpuwatch.store.schema import _MIG, MIGRATIONS, SCHEMA_VERSION
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.source import StoreSource

GiB = fake_pynvml.GiB
GPUWATCH = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpuwatch"
# GPU 1 in MIG mode with four MIG devices; its three processes land on the first three.
MIG = {1: ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]}


def fake(clock=None, **options) -> fake_pynvml.FakeNvml:
    options = {"gpus": 2, "procs_per_gpu": 3, "mig": MIG, **options}
    return fake_pynvml.FakeNvml(clock=clock.seconds if clock else fake_pynvml.time.time, **options)


# --- the collector ---


def test_mig_devices_are_listed_under_their_gpu_with_profile_memory_and_no_utilisation(caplog):
    caplog.set_level(logging.WARNING)
    c = NvmlCollector(fake())
    gpus, procs = c.sample(1000)
    assert [(m.gpu_index, m.gpu_instance_id, m.compute_instance_id, m.profile) for m in c.mig_static] == [
        (1, 1, 0, "3g.40gb"),
        (1, 2, 0, "2g.20gb"),
        (1, 3, 0, "1g.10gb"),
        (1, 4, 0, "1g.10gb"),
    ]
    assert all(m.uuid.startswith("MIG-") and m.name.endswith("(simulated)") for m in c.mig_static)
    assert [m.mem_total_bytes // GiB for m in c.mig_static] == [40, 20, 10, 10]
    assert [m.sm_count for m in c.mig_static] == [48, 32, 16, 16]
    migs = c.sample_mig(1000)
    # Memory is the MIG device's own: the sum of its processes', not the whole GPU's.
    assert [m.mem_used_bytes for m in migs] == [
        fake_pynvml.FakeNvml._proc_mem(4_000_100 + k) for k in range(3)
    ] + [0]
    assert all(
        m.mem_used_bytes + m.mem_free_bytes < m_total.mem_total_bytes
        for m, m_total in zip(migs, c.mig_static)
    )
    # NVML gives no utilisation in MIG mode: not available, not 0.
    assert {(m.gpu_util_pct, m.mem_util_pct) for m in migs} == {(None, None)}
    assert gpus[1].gpu_util_pct is None and gpus[0].gpu_util_pct is not None
    # Each process is attributed to the MIG device it runs on; off MIG there is none.
    on = {p.pid: (p.gpu_index, p.gpu_instance_id, p.compute_instance_id) for p in procs}
    assert on == {4_000_000 + k: (0, None, None) for k in range(3)} | {
        4_000_100 + k: (1, k + 1, 0) for k in range(3)
    }
    assert all(p.used_mem_bytes > 0 for p in procs)
    assert not caplog.records  # refused MIG calls are "not available", not warnings


def test_mig_processes_come_from_each_mig_handle_and_utilisation_where_nvml_gives_it():
    nvml = fake(mig_util=True)
    c = NvmlCollector(nvml)
    c.sample(1000)
    assert nvml.gpu_calls["nvmlDeviceGetComputeRunningProcesses", 1] == 4  # one per MIG device
    assert all(m.gpu_util_pct is not None for m in c.sample_mig(1000))


def test_mig_devices_created_and_destroyed_while_running_are_found_on_the_next_rescan():
    nvml = fake()
    c = NvmlCollector(nvml)
    c.sample(0)
    nvml.set_mig(1, ["7g.80gb"])
    c.sample(MIG_RESCAN_MS - 1)
    assert len(c.mig_static) == 4  # not looked for again yet
    _, procs = c.sample(MIG_RESCAN_MS)
    assert [(m.gpu_instance_id, m.profile) for m in c.mig_static] == [(1, "7g.80gb")]
    assert {p.gpu_instance_id for p in procs if p.gpu_index == 1} == {1}
    nvml.set_mig(1, [])
    c.sample(2 * MIG_RESCAN_MS)
    assert c.mig_static == [] and c.sample_mig(2 * MIG_RESCAN_MS) == []


def test_a_lost_mig_gpu_has_no_mig_samples_and_its_devices_return_with_it():
    nvml = fake()
    c = NvmlCollector(nvml)
    c.sample(0)
    nvml.set_lost(1)
    gpus, _ = c.sample(1000)
    assert gpus[1].state == "lost" and c.sample_mig(1000) == []
    nvml.set_lost(1, False)
    gpus, procs = c.sample(2000)
    assert gpus[1].state is None and len(c.sample_mig(2000)) == 4
    assert {p.gpu_instance_id for p in procs if p.gpu_index == 1} == {1, 2, 3}


def test_profile_comes_from_the_attributes_when_the_driver_gives_no_name():
    c = NvmlCollector(fake(unsupported={1: {"nvmlDeviceGetName"}}))
    assert [m.profile for m in c.mig_static] == MIG[1]


# --- the store ---


@pytest.fixture
def sampled(tmp_path):
    """A database a sampler wrote for 11 ticks of 1 s: two GPUs, GPU 1 in MIG mode."""
    path = str(tmp_path / "gw.db")
    clock = Clock()
    writer = Writer(path)
    sampler = Sampler(writer, Config(process_interval=5.0), nvml_module=fake(clock), clock=clock)
    for _ in range(11):
        sampler.tick()
        clock.ms += 1000
    writer.close()
    return path, clock


def test_sampler_writes_mig_devices_and_samples_at_the_process_cadence(sampled):
    path, clock = sampled
    conn = sqlite3.connect(path)
    devices = conn.execute(
        "SELECT gpu_index, gpu_instance_id, compute_instance_id, profile, "
        "uuid LIKE 'MIG-%', mem_total_bytes FROM mig_devices ORDER BY 2"
    ).fetchall()
    assert devices == [(1, k + 1, 0, p, 1, int(p.split(".")[1][:-2]) * GiB) for k, p in enumerate(MIG[1])]
    # Process ticks at 0 s, 5 s and 10 s: MIG samples go with them, four devices each.
    ticks = conn.execute("SELECT ts_ms, count(*) FROM mig_samples GROUP BY ts_ms").fetchall()
    assert [(ts - (clock.ms - 11_000), n) for ts, n in ticks] == [(0, 4), (5000, 4), (10_000, 4)]
    assert conn.execute("SELECT DISTINCT ts_ms FROM gpu_process_samples").fetchall() == [
        (ts,) for ts, _ in ticks
    ]
    on = conn.execute(
        "SELECT gpu_index, gpu_instance_id, compute_instance_id FROM gpu_process_samples "
        "WHERE ts_ms = ? ORDER BY pid",
        (ticks[-1][0],),
    ).fetchall()
    assert on == [(0, None, None)] * 3 + [(1, 1, 0), (1, 2, 0), (1, 3, 0)]
    current = queries.mig_devices(open_ro(path))
    assert [(d.gpu_instance_id, d.profile, d.gpu_util_pct) for d in current] == [
        (k + 1, p, None) for k, p in enumerate(MIG[1])
    ]
    assert current[0].mem_used_bytes == fake_pynvml.FakeNvml._proc_mem(4_000_100)
    procs = queries.gpu_processes(open_ro(path))
    assert {(p.gpu_index, p.gpu_instance_id) for p in procs} == {(0, None), (1, 1), (1, 2), (1, 3)}


def test_mig_devices_gone_when_mig_samples_stop_while_gpu_samples_go_on(tmp_path):
    path = str(tmp_path / "gw.db")
    clock = Clock()
    writer = Writer(path)
    nvml = fake(clock)
    sampler = Sampler(writer, Config(), nvml_module=nvml, clock=clock)
    sampler.tick()
    del nvml.mig[1]  # MIG mode off (after a GPU reset in real life)
    for _ in range(3):
        clock.ms += MIG_RESCAN_MS // 2
        sampler.tick()
    writer.close()
    assert queries.mig_devices(open_ro(path)) == []
    assert sqlite3.connect(path).execute("SELECT count(*) FROM mig_devices").fetchone() == (4,)


def test_the_mig_migration_upgrades_an_older_database_in_place(tmp_path):
    path = tmp_path / "old.db"
    before = MIGRATIONS.index(_MIG)
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:before]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {before}")
    conn.execute(
        "INSERT INTO gpu_process_samples (gpu_index, pid, ts_ms, used_mem_bytes) VALUES (0, 42, 1000, 7)"
    )
    conn.commit()
    conn.close()
    conn = open_rw(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute(
        "SELECT pid, used_mem_bytes, gpu_instance_id, compute_instance_id FROM gpu_process_samples"
    ).fetchall() == [(42, 7, None, None)]
    assert queries.mig_devices(conn) == []


@pytest.mark.parametrize(
    "visible",
    ["MIG-fa4e0000-0000-4000-9000-000001000001", "MIG-GPU-fa4e0000-0000-4000-8000-000000000001/2/0"],
)
def test_oom_neighbours_on_a_mig_device_are_only_those_on_that_mig_device(sampled, visible):
    """A MIG device's memory is its own: processes on the GPU's other MIG devices took none of it."""
    from gpuwatch.store import insert_rows
    from gpuwatch.store.events import Peer, apply_events

    path, clock = sampled
    conn = open_rw(path)
    victim = 4_000_101  # on MIG device 1/2/0 (its MIG UUID, or the legacy GPU-UUID/GI/CI form)
    peer = Peer(uid=1000, user="alice", pid=victim, mode="daemon")
    apply_events(
        conn,
        [{"id": "s", "kind": "run_start", "run_id": "r", "ts_ms": clock() - 5000, "gpu_uuids": visible}],
        peer,
    )
    newest = conn.execute("SELECT max(ts_ms) FROM gpu_process_samples").fetchone()[0]
    insert_rows(
        conn,
        "gpu_process_samples",
        [  # a second process on 1/2/0
            {
                "gpu_index": 1,
                "pid": 4_000_199,
                "ts_ms": newest,
                "used_mem_bytes": GiB,
                "gpu_instance_id": 2,
                "compute_instance_id": 0,
            }
        ],
    )
    apply_events(
        conn,
        [
            {
                "id": "o",
                "kind": "oom_postmortem",
                "run_id": "r",
                "ts_ms": clock(),
                "oom_kind": "gpu",
                "device": 0,
            }
        ],
        peer,
    )
    conn.commit()
    neighbours = json.loads(conn.execute("SELECT neighbours_json FROM oom_postmortems").fetchone()[0])
    assert [n["pid"] for n in neighbours] == [4_000_199]


# --- what users see ---


@pilot_test
async def test_overview_lists_mig_devices_under_their_gpu_with_their_processes(sampled):
    path, clock = sampled
    app = GpuwatchApp(StoreSource(path, clock=clock), refresh_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        lines = app.screen.query_one("#gpus").plain_lines()
        gpu1 = next(i for i, text in enumerate(lines) if text.startswith("  1 "))
        migs = lines[gpu1 + 1 :]
        assert [text.split()[1:3] for text in migs] == [
            ["1/1/0", "3g.40gb"],
            ["1/2/0", "2g.20gb"],
            ["1/3/0", "1g.10gb"],
            ["1/4/0", "1g.10gb"],
        ]
        assert all("util n/a" in text for text in migs)
        assert [text.split()[-2:] for text in migs] == [["1", "proc"]] * 3 + [["0", "procs"]]
        assert f" {fmt.size(fake_pynvml.FakeNvml._proc_mem(4_000_100))} " in migs[0]
        table = app.screen.query_one("#processes")
        gpu_cells = sorted(str(table.get_row_at(i)[2]) for i in range(table.row_count))
        assert gpu_cells == ["0", "0", "0", "1/1/0", "1/2/0", "1/3/0"]


def test_status_shows_mig_devices_under_their_gpu_and_processes_on_them(sampled):
    from gpuwatch.cli.status_cmd import render, view_from_db

    path, clock = sampled
    out = render(view_from_db(open_ro(path), clock()), 100).splitlines()
    gpu1 = next(i for i, line in enumerate(out) if line.split()[0] == "1")
    assert [line.split()[:4] for line in out[gpu1 + 1 : gpu1 + 5]] == [
        [f"1/{k + 1}/0", "└", "MIG", p] for k, p in enumerate(MIG[1])
    ]
    assert all(" n/a " in line and " GiB  " in line for line in out[gpu1 + 1 : gpu1 + 5])
    assert [line.split()[-2:] for line in out[gpu1 + 1 : gpu1 + 5]] == [["1", "proc"]] * 3 + [["0", "procs"]]
    procs = out[[line.split()[:1] for line in out].index(["pid"]) + 1 :]
    assert [line.split()[2] for line in procs] == ["0", "0", "0", "1/1/0", "1/2/0", "1/3/0"]


def _made_current(path: str, clock) -> str:
    """The sampled database with its samples moved to now, for /metrics' freshness check."""
    conn = sqlite3.connect(path)
    shift = int(fake_pynvml.time.time() * 1000 - clock.ms)
    for table in ("gpu_samples", "mig_samples", "gpu_process_samples", "host_samples"):
        conn.execute(f"UPDATE {table} SET ts_ms = ts_ms + ?", (shift,))
    conn.commit()
    conn.close()
    return path


def test_metrics_label_mig_devices_as_dcgm_exporter_does(sampled):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    path = _made_current(*sampled)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(path, hostname="node-1"))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    used = [s for s in families["DCGM_FI_DEV_FB_USED"].samples]
    whole = {s.labels["gpu"]: s for s in used if "GPU_I_ID" not in s.labels}
    mig = [s for s in used if "GPU_I_ID" in s.labels]
    assert sorted(whole) == ["0", "1"]
    assert [(s.labels["GPU_I_ID"], s.labels["GPU_I_PROFILE"]) for s in mig] == [
        (str(k + 1), p) for k, p in enumerate(MIG[1])
    ]
    parent = whole["1"].labels
    for s in mig:  # the parent GPU's identity, as dcgm-exporter labels a GPU instance
        assert {k: s.labels[k] for k in parent} == parent
    assert mig[0].value == fake_pynvml.FakeNvml._proc_mem(4_000_100) / 2**20 and mig[3].value == 0
    assert all("GPU_I_ID" not in s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples)
    free = [s for s in families["DCGM_FI_DEV_FB_FREE"].samples if "GPU_I_ID" in s.labels]
    assert len(free) == 4


@needs_prometheus
@pytest.mark.slow
def test_a_real_prometheus_tells_mig_devices_from_whole_gpus(sampled, tmp_path):
    from gpuwatch.daemon.metrics import start_metrics_server

    server = start_metrics_server("127.0.0.1:0", _made_current(*sampled))
    try:
        text = scrape(server)
        # promtool's only complaint is the one about dcgm-exporter's camelCase label names.
        assert all("snake_case" in p for p in _promtool_problems(text))
        with prometheus_scraping(tmp_path, server.port) as prom_port:
            migs = _wait_for(prom_port, 'DCGM_FI_DEV_FB_USED{GPU_I_ID!=""}', 4, tmp_path / "prometheus.log")
            whole = _query(prom_port, 'count(DCGM_FI_DEV_FB_USED{GPU_I_ID=""})')
    finally:
        server.close()
    assert sorted((r["metric"]["GPU_I_ID"], r["metric"]["GPU_I_PROFILE"]) for r in migs) == [
        (str(k + 1), p) for k, p in enumerate(MIG[1])
    ]
    assert {r["metric"]["gpu"] for r in migs} == {"1"}
    assert float(whole[0]["value"][1]) == 2


# --- a real driver ---


@pytest.mark.gpu
def test_real_mig_devices():
    import pynvml

    c = NvmlCollector()
    try:
        _, procs = c.sample(1000)
        enabled = [s for s in c.static if s.mig_mode == pynvml.NVML_DEVICE_MIG_ENABLE]
        if not enabled:
            pytest.skip("no GPU here is in MIG mode (nvidia-smi -i N -mig 1)")
        assert {m.gpu_index for m in c.mig_static} <= {s.gpu_index for s in enabled}
        for m in c.mig_static:
            assert m.uuid.startswith("MIG-") and m.profile and "g." in m.profile
            assert m.mem_total_bytes and m.sm_count
        for m in c.mig_static:  # the MIG UUID names this MIG device, under this GPU
            handle = pynvml.nvmlDeviceGetHandleByUUID(m.uuid)
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            assert pynvml.nvmlDeviceGetUUID(parent) == c.static[m.gpu_index].uuid
            assert pynvml.nvmlDeviceGetGpuInstanceId(handle) == m.gpu_instance_id
            assert pynvml.nvmlDeviceGetComputeInstanceId(handle) == m.compute_instance_id
        samples = c.sample_mig(1000)
        assert len(samples) == len(c.mig_static)
        assert all(s.mem_used_bytes is not None and s.mem_free_bytes is not None for s in samples)
        known = {(m.gpu_index, m.gpu_instance_id, m.compute_instance_id) for m in c.mig_static}
        on_mig = [p for p in procs if p.gpu_index in {s.gpu_index for s in enabled}]
        assert all((p.gpu_index, p.gpu_instance_id, p.compute_instance_id) in known for p in on_mig)
        out = subprocess.run(
            [str(GPUWATCH), "status", "--db", "/nonexistent/gw.db"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        assert all(f"MIG {m.profile}" in out for m in c.mig_static)
    finally:
        c.close()

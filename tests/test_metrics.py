"""The /metrics endpoint over a real database file: names, units, labels, cardinality."""

from __future__ import annotations

import json
import re
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.base.config import ConfigError
from gpuwatch.daemon.metrics import parse_listen, start_metrics_server
from gpuwatch.store import insert_rows, now_ms, open_rw

GIB = 1024**3
MIB = 1024**2


def fill_fleet(path, *, gpus=2, runs=3, running=(0,), steps=5, ts=None):
    """A database holding `gpus` GPUs with two samples each and `runs` runs with steps.

    GPU i's newest sample: util 10*i+5 %, used (i+1) GiB, free 79-i GiB, 60+i C, 250.5 W, 1e6+i mJ.
    Runs whose index is in `running` are running; the others finished. Step s of run r reports
    tokens_per_s 1000*(r+1)+s and mem_peak_bytes (s+1)*MiB, so the peak is steps MiB.
    """
    ts = now_ms() if ts is None else ts
    conn = open_rw(path)
    insert_rows(
        conn,
        "gpus",
        [
            dict(
                gpu_index=i,
                uuid=f"GPU-{i:04d}",
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{i:02X}:00.0",
                mem_total_bytes=80 * GIB,
                first_seen_ms=ts - 10_000,
                last_seen_ms=ts,
            )
            for i in range(gpus)
        ],
    )
    samples = []
    for i in range(gpus):
        samples.append(dict(gpu_index=i, ts_ms=ts - 1000, gpu_util_pct=99, mem_used_bytes=0))
        samples.append(
            dict(
                gpu_index=i,
                ts_ms=ts,
                gpu_util_pct=10 * i + 5,
                mem_util_pct=i,
                mem_used_bytes=(i + 1) * GIB,
                mem_free_bytes=(79 - i) * GIB,
                temp_c=60 + i,
                power_mw=250_500,
                energy_mj=1_000_000 + i,
                sm_clock_mhz=1980,
                mem_clock_mhz=2619,
                pcie_tx_kbps=100,
                pcie_rx_kbps=200,
                ecc_corrected=0,
                ecc_uncorrected=0,
                throttle_reasons=0,
            )
        )
    insert_rows(conn, "gpu_samples", samples)
    insert_rows(
        conn,
        "host_samples",
        [
            dict(
                ts_ms=ts,
                cpu_pct=12.5,
                load1=3.0,
                mem_total_bytes=512 * GIB,
                mem_used_bytes=100 * GIB,
                mem_available_bytes=400 * GIB,
                shm_total_bytes=64 * GIB,
                shm_used_bytes=GIB,
            )
        ],
    )
    insert_rows(
        conn,
        "daemon_stats",
        [
            dict(
                ts_ms=ts,
                cpu_pct=0.7,
                rss_bytes=50 * MIB,
                tick_ms=3.5,
                queue_depth=2,
                dropped_events=0,
                db_bytes=0,
            )
        ],
    )
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id=f"run-{r}",
                name=f"exp{r}",
                uid=1000,
                user="alice",
                status="running" if r in running else "finished",
                started_ms=ts - 60_000,
                rank=0,
            )
            for r in range(runs)
        ],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(
                run_id=f"run-{r}",
                step=s,
                ts_ms=ts - 1000 * (steps - s),
                tokens_per_s=1000.0 * (r + 1) + s,
                mem_peak_bytes=(s + 1) * MIB,
            )
            for r in range(runs)
            for s in range(steps)
        ],
    )
    conn.execute("COMMIT")
    return conn


def scrape(server) -> str:
    with urllib.request.urlopen(server.url, timeout=10) as resp:
        return resp.read().decode()


def scrape_and_close(db, conn, **server_options) -> dict[str, list]:
    """One scrape of a metrics server on `db`, then the server and `conn` are closed."""
    server = start_metrics_server("127.0.0.1:0", db, **server_options)
    try:
        return samples_by_name(scrape(server))
    finally:
        server.close()
        conn.close()


def samples_by_name(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture
def served(tmp_path):
    db = tmp_path / "g.db"
    conn = fill_fleet(db)
    server = start_metrics_server("127.0.0.1:0", db, extra=lambda: {"ingest_connections": 3})
    yield server, conn, db
    server.close()
    conn.close()


def test_gpu_metrics_use_dcgm_names_units_and_labels(served):
    server, _, _ = served
    text = scrape(server)
    got = samples_by_name(text)
    util = {s.labels["gpu"]: s for s in got["DCGM_FI_DEV_GPU_UTIL"]}
    assert {g: s.value for g, s in util.items()} == {"0": 5, "1": 15}  # newest sample, not the 99s
    assert util["1"].labels == {
        "gpu": "1",
        "UUID": "GPU-0001",
        "pci_bus_id": "00000000:01:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": socket.gethostname(),
    }
    by_gpu = lambda name: {s.labels["gpu"]: s.value for s in got[name]}  # noqa: E731
    assert by_gpu("DCGM_FI_DEV_FB_USED") == {"0": 1024, "1": 2048}  # MiB, as dcgm-exporter
    assert by_gpu("DCGM_FI_DEV_FB_FREE") == {"0": 79 * 1024, "1": 78 * 1024}
    assert by_gpu("DCGM_FI_DEV_POWER_USAGE") == {"0": 250.5, "1": 250.5}  # W
    assert by_gpu("DCGM_FI_DEV_GPU_TEMP") == {"0": 60, "1": 61}
    assert by_gpu("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == {"0": 1_000_000, "1": 1_000_001}
    assert by_gpu("DCGM_FI_DEV_SM_CLOCK")["0"] == 1980
    assert by_gpu("DCGM_FI_DEV_XID_ERRORS") == {"0": 0, "1": 0}
    assert by_gpu("gpuwatch_gpu_pcie_rx_bytes_per_second")["0"] == 200 * 1024
    # dcgm's exact names, with no `_total` added by the client library.
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in text


def test_last_xid_per_gpu(served):
    server, conn, _ = served
    ts = now_ms()
    insert_rows(
        conn,
        "xid_events",
        [dict(ts_ms=ts - 5000, gpu_index=1, xid=13), dict(ts_ms=ts - 100, gpu_index=1, xid=79)],
    )
    values = {s.labels["gpu"]: s.value for s in samples_by_name(scrape(server))["DCGM_FI_DEV_XID_ERRORS"]}
    assert values == {"0": 0, "1": 79}


def test_host_daemon_and_extra_metrics(served):
    server, _, db = served
    got = samples_by_name(scrape(server))
    value = lambda name: got[name][0].value  # noqa: E731
    assert value("gpuwatch_host_cpu_percent") == 12.5
    assert value("gpuwatch_host_shm_total_bytes") == 64 * GIB
    assert value("gpuwatch_daemon_tick_seconds") == pytest.approx(0.0035)
    assert value("gpuwatch_daemon_writer_queue_depth") == 2
    assert value("gpuwatch_daemon_ingest_connections") == 3
    assert value("gpuwatch_database_size_bytes") >= db.stat().st_size > 0
    assert value("gpuwatch_store_up") == 1


def test_run_metrics_and_peak_follows_new_steps(served):
    server, conn, _ = served
    got = samples_by_name(scrape(server))
    [tps] = got["gpuwatch_run_tokens_per_second"]
    assert tps.labels == {
        "run_id": "run-0",
        "name": "exp0",
        "user": "alice",
        "job_id": "run-0",
        "rank": "0",
        "Hostname": socket.gethostname(),
    }
    assert tps.value == 1004.0
    assert got["gpuwatch_run_peak_memory_bytes"][0].value == 5 * MIB
    insert_rows(
        conn,
        "steps",
        [dict(run_id="run-0", step=5, ts_ms=now_ms(), tokens_per_s=900.0, mem_peak_bytes=64 * MIB)],
    )
    got = samples_by_name(scrape(server))
    assert got["gpuwatch_run_tokens_per_second"][0].value == 900.0
    assert got["gpuwatch_run_peak_memory_bytes"][0].value == 64 * MIB


def test_only_running_runs_are_exported_among_1000(tmp_path):
    db = tmp_path / "g.db"
    running = set(range(0, 1000, 100))
    conn = fill_fleet(db, runs=1000, running=running, steps=2)
    got = scrape_and_close(db, conn)
    assert {s.labels["run_id"] for s in got["gpuwatch_run_tokens_per_second"]} == {
        f"run-{r}" for r in running
    }
    assert len(got["gpuwatch_run_peak_memory_bytes"]) == 10
    assert {s.labels["status"]: s.value for s in got["gpuwatch_runs"]} == {"running": 10, "finished": 990}


def test_stale_and_lost_gpus_are_left_out(tmp_path):
    db = tmp_path / "g.db"
    conn = fill_fleet(db, ts=now_ms() - 3_600_000)
    got = scrape_and_close(db, conn)
    assert "DCGM_FI_DEV_GPU_UTIL" not in got
    assert "gpuwatch_host_cpu_percent" not in got


def test_missing_database_keeps_endpoint_up(tmp_path):
    server = start_metrics_server("127.0.0.1:0", tmp_path / "nope.db")
    try:
        got = samples_by_name(scrape(server))
    finally:
        server.close()
    assert got["gpuwatch_store_up"][0].value == 0


@pytest.mark.parametrize(
    "listen, expected",
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        (":9400", ("127.0.0.1", 9400)),
        ("9400", ("127.0.0.1", 9400)),
        ("0.0.0.0:9100", ("0.0.0.0", 9100)),
        ("[::1]:9400", ("::1", 9400)),
    ],
)
def test_parse_listen(listen, expected):
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("bad", ["", "localhost", "host:port", "127.0.0.1:70000", "1.2.3.4:-1"])
def test_parse_listen_rejects_bad_values(bad):
    with pytest.raises(ConfigError, match="metrics_listen: expected HOST:PORT"):
        parse_listen(bad)


def test_port_in_use_is_one_clear_error(tmp_path):
    first = start_metrics_server("127.0.0.1:0", tmp_path / "g.db")
    try:
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            start_metrics_server(f"127.0.0.1:{first.port}", tmp_path / "g.db")
    finally:
        first.close()


def test_grafana_dashboard_queries_exported_metrics(served):
    """Every metric the shipped dashboard plots is one /metrics serves."""
    server, conn, _ = served
    add_gpu_processes(conn, [(0, 10, "bob", GIB)])
    exported = set(samples_by_name(scrape(server)))
    dashboard = json.loads((Path(__file__).parent.parent / "grafana" / "gpuwatch-runs.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(DCGM_FI_\w+|gpuwatch_\w+)", e)}
    assert {
        "gpuwatch_run_tokens_per_second",
        "gpuwatch_run_peak_memory_bytes",
        "DCGM_FI_DEV_GPU_UTIL",
        "gpuwatch_gpu_user_memory_bytes",
        "gpuwatch_gpu_up",
    } <= used
    assert used <= exported


def test_live_daemon_figure_replaces_the_stored_one(tmp_path):
    db = tmp_path / "g.db"
    conn = fill_fleet(db)  # stored daemon_stats says queue depth 2
    server = start_metrics_server("127.0.0.1:0", db, extra=lambda: {"writer_queue_depth": 7})
    try:
        got = samples_by_name(scrape(server))
    finally:
        server.close()
        conn.close()
    assert [s.value for s in got["gpuwatch_daemon_writer_queue_depth"]] == [7]


def add_gpu_processes(conn, procs, ts=None):
    """Processes on GPUs in one tick: procs is [(gpu_index, pid, user, used_bytes)]."""
    ts = now_ms() if ts is None else ts
    insert_rows(
        conn,
        "processes",
        [
            dict(
                pid=pid,
                start_ms=ts - 60_000,
                uid=1000 + pid,
                user=user,
                cmdline="python train.py",
                first_seen_ms=ts - 60_000,
                last_seen_ms=ts,
            )
            for _, pid, user, _ in procs
        ],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [dict(gpu_index=gpu, pid=pid, ts_ms=ts, used_mem_bytes=used) for gpu, pid, _, used in procs],
    )


def test_memory_per_user_per_gpu_is_bounded(tmp_path):
    """Two of bob's processes on GPU 0 sum; GPU 1's twelve users become seven plus '(others)'."""
    db = tmp_path / "g.db"
    conn = fill_fleet(db)
    procs = [(0, 10, "bob", 3 * GIB), (0, 11, "bob", GIB), (0, 12, "carol", 2 * GIB)]
    procs += [(1, 100 + u, f"user{u:02d}", (u + 1) * GIB) for u in range(12)]
    add_gpu_processes(conn, procs)
    got = scrape_and_close(db, conn)
    held = {(s.labels["gpu"], s.labels["user"]): s.value for s in got["gpuwatch_gpu_user_memory_bytes"]}
    assert {u: v for (g, u), v in held.items() if g == "0"} == {"bob": 4 * GIB, "carol": 2 * GIB}
    gpu1 = {u: v for (g, u), v in held.items() if g == "1"}
    assert len(gpu1) == 8  # MAX_USERS_PER_GPU series at most, whatever the number of users
    assert gpu1["user11"] == 12 * GIB and "user04" not in gpu1
    assert gpu1["(others)"] == sum((u + 1) * GIB for u in range(5))  # user00..user04
    assert sum(gpu1.values()) == sum((u + 1) * GIB for u in range(12))  # nothing lost


def test_host_label_gpu_up_throttling_and_last_sample(tmp_path):
    db = tmp_path / "g.db"
    ts = now_ms()
    conn = fill_fleet(db, gpus=3, ts=ts)
    conn.execute("UPDATE gpu_samples SET throttle_reasons = 0x40 WHERE gpu_index = 1")  # HW thermal
    conn.execute("UPDATE gpu_samples SET throttle_reasons = 0x1 WHERE gpu_index = 0")  # idle: normal
    conn.execute("UPDATE gpus SET state = 'lost' WHERE gpu_index = 2")
    got = scrape_and_close(db, conn, hostname="node-7")
    by_gpu = lambda name: {s.labels["gpu"]: s.value for s in got[name]}  # noqa: E731
    assert by_gpu("gpuwatch_gpu_up") == {"0": 1, "1": 1, "2": 0}
    assert by_gpu("gpuwatch_gpu_throttled") == {"0": 0, "1": 1}
    assert by_gpu("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS") == {"0": 1, "1": 0x40}
    assert {s.labels["Hostname"] for s in got["DCGM_FI_DEV_GPU_UTIL"] + got["gpuwatch_gpu_up"]} == {"node-7"}
    [last] = got["gpuwatch_host_last_sample_timestamp_seconds"]
    assert last.labels == {"Hostname": "node-7"} and last.value == ts / 1000

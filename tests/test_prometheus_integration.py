"""A real Prometheus (Debian's `prometheus` package) scrapes gpuwatch's /metrics endpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from systools import needs_tools
from test_metrics import fill_fleet, scrape

from gpuwatch.daemon.metrics import start_metrics_server
from gpuwatch.store import open_ro

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = needs_tools("prometheus", "promtool")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _promtool_problems(text: str) -> list[str]:
    check = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True)
    problems = (check.stdout + check.stderr).splitlines()
    assert (check.returncode == 0) == (not problems), problems
    return problems


def _query(port: int, promql: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]["result"]


@needs_prometheus
def test_promtool_accepts_the_scrape(tmp_path):
    db = tmp_path / "g.db"
    conn = fill_fleet(db, gpus=8, runs=20, running=range(0, 20, 2))
    server = start_metrics_server("127.0.0.1:0", db)
    try:
        text = scrape(server)
    finally:
        server.close()
        conn.close()
    problems = _promtool_problems(text)
    # dcgm-exporter's own label names (UUID, modelName, Hostname) are camelCase; they are kept so
    # dcgm dashboards work, and promtool's style lint about them is the only complaint allowed.
    assert problems and all("label names should be written in 'snake_case'" in p for p in problems)
    assert _promtool_problems(re.sub(r'(?:Hostname|UUID|modelName)="[^"]*",?', "", text)) == []


@contextlib.contextmanager
def prometheus_scraping(tmp_path, *target_ports: int, rule_files=()):
    """A real Prometheus scraping 127.0.0.1:target_port (each of them) every second, evaluating
    `rule_files` every second; yields its HTTP port."""
    prom_port = _free_port()
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f"'127.0.0.1:{port}'" for port in target_ports)
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{', '.join(repr(str(f)) for f in rule_files)}]\n"
        "scrape_configs:\n"
        f"  - job_name: gpuwatch\n    static_configs: [{{targets: [{targets}]}}]\n"
    )
    with open(tmp_path / "prometheus.log", "w") as log:
        prom = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield prom_port
        finally:
            prom.terminate()
            prom.wait(timeout=30)


def _wait_for(prom_port: int, promql: str, count: int, log: Path, timeout: float = 60) -> list:
    deadline = time.monotonic() + timeout
    result: list = []
    while time.monotonic() < deadline:
        try:
            result = _query(prom_port, promql)
        except OSError:
            result = []  # Prometheus still starting
        if len(result) >= count:
            return result
        time.sleep(0.5)
    raise AssertionError(
        f"{promql}: {len(result)} series after {timeout} s; prometheus log: {log.read_text()[-2000:]}"
    )


@needs_prometheus
@pytest.mark.slow
def test_prometheus_scrapes_a_real_daemon(tmp_path):
    """The daemon (simulated GPUs through the fake NVML) serves /metrics; Prometheus scrapes
    it; what Prometheus holds is what the daemon stored."""
    from fake_pynvml import FakeNvml

    from gpuwatch.base.config import load
    from gpuwatch.daemon.main import Daemon

    port = _free_port()
    cfg = load(
        {
            "db": str(tmp_path / "d.db"),
            "socket": str(tmp_path / "d.sock"),
            "system": False,
            "interval": 0.5,
            "metrics_listen": f"127.0.0.1:{port}",
        }
    )
    daemon = Daemon(cfg, nvml_module=FakeNvml(gpus=2, procs_per_gpu=1))  # busy: util varies
    thread = threading.Thread(target=asyncio.run, args=(daemon.serve(),))
    thread.start()
    try:
        with prometheus_scraping(tmp_path, port) as prom_port:
            util = _wait_for(prom_port, "DCGM_FI_DEV_GPU_UTIL", 2, tmp_path / "prometheus.log")
            host = _wait_for(prom_port, "gpuwatch_host_cpu_percent", 1, tmp_path / "prometheus.log")
    finally:
        daemon.request_stop()
        thread.join(timeout=30)
    conn = open_ro(cfg.db_path)
    stored = {
        i: {v for (v,) in conn.execute("SELECT gpu_util_pct FROM gpu_samples WHERE gpu_index = ?", (i,))}
        for i in range(2)
    }
    stored_cpu = {v for (v,) in conn.execute("SELECT cpu_pct FROM host_samples")}
    conn.close()
    assert {r["metric"]["gpu"] for r in util} == {"0", "1"}
    for r in util:
        assert float(r["value"][1]) in stored[int(r["metric"]["gpu"])] - {0}
        assert r["metric"]["modelName"].endswith("(simulated)")
    assert float(host[0]["value"][1]) in stored_cpu
    assert not thread.is_alive()


@needs_prometheus
@pytest.mark.slow
def test_prometheus_scrapes_stored_samples(tmp_path):
    db = tmp_path / "g.db"
    conn = fill_fleet(db, gpus=4, runs=3, running=(1,))
    server = start_metrics_server("127.0.0.1:0", db)
    try:
        with prometheus_scraping(tmp_path, server.port) as prom_port:
            log = tmp_path / "prometheus.log"
            util = _wait_for(prom_port, "DCGM_FI_DEV_GPU_UTIL", 4, log)
            tps = _wait_for(prom_port, "gpuwatch_run_tokens_per_second", 1, log)
            fb = _query(prom_port, 'DCGM_FI_DEV_FB_USED{gpu="3"}')
        assert {r["metric"]["gpu"]: float(r["value"][1]) for r in util} == {"0": 5, "1": 15, "2": 25, "3": 35}
        assert {r["metric"]["job"] for r in util} == {"gpuwatch"}
        [run] = tps
        assert run["metric"]["run_id"] == "run-1" and float(run["value"][1]) == 2004.0
        assert float(fb[0]["value"][1]) == 4 * 1024  # 4 GiB stored -> 4096 MiB
    finally:
        server.close()
        conn.close()

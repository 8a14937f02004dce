"""A real Prometheus (Debian's `prometheus` package) scrapes gpuwatch's /metrics endpoint."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from gpuwatch.daemon.metrics import start_metrics_server
from test_metrics import fill_fleet, scrape

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None,
    reason="needs Debian's prometheus package (apt-get install prometheus; .ci/run installs it)")


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


@needs_prometheus
@pytest.mark.slow
def test_prometheus_scrapes_stored_samples(tmp_path):
    db = tmp_path / "g.db"
    conn = fill_fleet(db, gpus=4, runs=3, running=(1,))
    server = start_metrics_server("127.0.0.1:0", db)
    prom_port = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: gpuwatch\n    static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]\n")
    log = open(tmp_path / "prometheus.log", "w")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        util = tps = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (len(util) == 4 and tps):
            time.sleep(0.5)
            try:
                util = _query(prom_port, "DCGM_FI_DEV_GPU_UTIL")
                tps = _query(prom_port, "gpuwatch_run_tokens_per_second")
            except OSError:
                continue  # Prometheus still starting
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()
        assert len(util) == 4, (tmp_path / "prometheus.log").read_text()[-2000:]
        assert {r["metric"]["gpu"]: float(r["value"][1]) for r in util} == {
            "0": 5, "1": 15, "2": 25, "3": 35}
        assert {r["metric"]["job"] for r in util} == {"gpuwatch"}
        [run] = tps
        assert run["metric"]["run_id"] == "run-1" and float(run["value"][1]) == 2004.0
        fb = _query(prom_port, 'DCGM_FI_DEV_FB_USED{gpu="3"}')
        assert float(fb[0]["value"][1]) == 4 * 1024  # 4 GiB stored -> 4096 MiB
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        log.close()
        server.close()
        conn.close()

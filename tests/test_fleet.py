"""The fleet through a real Prometheus: three daemons on this machine pose as three hosts (their
own Hostname label, port and database), one of them stopped; the Fleet screen, the Jobs view and
`gpuwatch pick` read them back. And what a broken Prometheus looks like to a user."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import pwd
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.text import Text
from systools import needs_tools
from test_prometheus_integration import PROMTOOL, _free_port, _query, _wait_for, prometheus_scraping
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from gpuwatch.cli import main
from gpuwatch.fleet.pick import Candidate, NothingFits, choose
from gpuwatch.store import insert_rows, now_ms, open_ro, open_rw
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.fleet_source import PrometheusSource
from gpuwatch.tui.screens.fleet import FleetScreen, RowList
from gpuwatch.tui.source import StoreSource

needs_prometheus = needs_tools("prometheus")

GIB = 1024**3
ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "prometheus" / "gpuwatch-rules.yml"
JOB = "torchrun-job42@node-a:29500"
FAKE_PID = 4_000_000 + 100  # a made-up pid on GPU 1 of host-b: nobody this test knows owns it
# (host, rank, tokens/s): a two-host job whose rank 3 is slow.
RANKS = (("host-a", 0, 1000.0), ("host-a", 1, 1000.0), ("host-b", 2, 1000.0), ("host-b", 3, 400.0))


@dataclass
class Host:
    name: str
    db: Path
    port: int
    daemon: object
    thread: threading.Thread

    def stop(self) -> None:
        if self.thread.is_alive():
            self.daemon.request_stop()
            self.thread.join(timeout=30)


def _start_host(tmp: Path, name: str, procs: dict) -> Host:
    from fake_pynvml import FakeNvml

    from gpuwatch.base.config import load
    from gpuwatch.daemon.main import Daemon

    port = _free_port()
    cfg = load(
        {
            "db": str(tmp / f"{name}.db"),
            "socket": str(tmp / f"{name}.sock"),
            "system": False,
            "interval": 0.5,
            "process_interval": 0.5,
            "metrics_listen": f"127.0.0.1:{port}",
            "metrics_hostname": name,
        }
    )
    daemon = Daemon(cfg, nvml_module=FakeNvml(gpus=2, procs=procs))
    thread = threading.Thread(target=asyncio.run, args=(daemon.serve(),), daemon=True)
    thread.start()
    return Host(name, cfg.db_path, port, daemon, thread)


def _add_job_ranks(host: Host) -> None:
    """The two-host job's ranks that run on `host`, as a client on that host would store them."""
    ts = now_ms()
    conn = open_rw(host.db)
    for name, rank, tps in RANKS:
        if name == host.name:
            run_id = f"{name}-rank{rank}"
            insert_rows(
                conn,
                "runs",
                [
                    dict(
                        run_id=run_id,
                        name="gpt-8k",
                        uid=1000,
                        user="alice",
                        status="running",
                        started_ms=ts - 60_000,
                        rank=rank,
                        world_size=4,
                        job_id=JOB,
                        host=name,
                    )
                ],
            )
            insert_rows(
                conn,
                "steps",
                [
                    dict(
                        run_id=run_id,
                        step=s,
                        ts_ms=ts - 1000 * (3 - s),
                        tokens_per_s=tps,
                        mem_peak_bytes=(rank + 1) * GIB,
                    )
                    for s in range(3)
                ],
            )
    conn.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Prometheus scraping host-a, host-b and host-c every second; host-c stopped once scraped.
    host-a GPU 0 runs this test's own process, host-b GPU 1 a stranger's; the others are idle."""
    tmp = tmp_path_factory.mktemp("fleet")
    hosts = {
        "host-a": _start_host(tmp, "host-a", {0: [os.getpid()]}),
        "host-b": _start_host(tmp, "host-b", {1: [FAKE_PID]}),
        "host-c": _start_host(tmp, "host-c", {}),
    }
    try:
        for host in hosts.values():
            _add_job_ranks(host)
        with prometheus_scraping(tmp, *(h.port for h in hosts.values()), rule_files=[RULES]) as prom_port:
            log = tmp / "prometheus.log"
            _wait_for(prom_port, "gpuwatch_run_tokens_per_second", len(RANKS), log)
            _wait_for(prom_port, "gpuwatch_gpu_user_memory_bytes", 2, log)
            _wait_for(prom_port, "count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 6, log)
            hosts["host-c"].stop()
            _wait_for(prom_port, 'up{instance="127.0.0.1:%d"} == 0' % hosts["host-c"].port, 1, log)
            yield f"http://127.0.0.1:{prom_port}", hosts
    finally:
        for host in hosts.values():
            host.stop()


async def _fleet_shown(app, pilot, ready=lambda snap: True) -> None:
    """Wait (up to 5 s) until the Fleet screen shows a snapshot that is `ready`."""
    for _ in range(50):
        await pilot.pause(0.1)
        if isinstance(app.screen, FleetScreen) and app.screen.shown is not None and ready(app.screen.shown):
            return


def _stored(host: Host, column: str, gpu: int) -> set:
    conn = open_ro(host.db)
    try:
        return {v for (v,) in conn.execute(f"SELECT {column} FROM gpu_samples WHERE gpu_index = ?", (gpu,))}
    finally:
        conn.close()


def _fleet_app(url: str, hosts: dict) -> GpuwatchApp:
    """The TUI as host-a's user opens it with --prometheus: on the Fleet screen."""
    return GpuwatchApp(
        StoreSource(str(hosts["host-a"].db)), refresh_s=30, start_mode="fleet", fleet=PrometheusSource(url)
    )


def _cells(screen: FleetScreen) -> list[list[str]]:
    return [
        [c.plain if isinstance(c, Text) else str(c) for c in cells]
        for _, cells in screen.query_one(RowList).rows
    ]


@needs_prometheus
@pytest.mark.slow
@pilot_test
async def test_fleet_screen_shows_every_host_and_the_stopped_one_unreachable(fleet):
    url, hosts = fleet
    app = _fleet_app(url, hosts)
    async with app.run_test(size=(80, 24)) as pilot:
        await _fleet_shown(app, pilot)
        screen = app.screen
        snap = screen.shown
        assert snap.problem is None, snap.problem
        assert [(h.name, h.up) for h in snap.fleet.hosts] == [
            ("host-a", True),
            ("host-b", True),
            ("host-c", False),
        ]
        # Values are the daemons' stored samples, as Prometheus scraped them.
        assert {(g.host, g.index) for g in snap.fleet.gpus} == {
            (h, i) for h in ("host-a", "host-b") for i in (0, 1)
        }
        for g in snap.fleet.gpus:
            host = hosts[g.host]
            assert g.util_pct in _stored(host, "gpu_util_pct", g.index)
            assert g.mem_used_bytes in _stored(host, "mem_used_bytes", g.index)
            assert g.temp_c in _stored(host, "temp_c", g.index)
            assert g.power_w * 1000 in _stored(host, "power_mw", g.index)
        users = {(g.host, g.index): [u for u, _ in g.users] for g in snap.fleet.gpus}
        assert users[("host-a", 0)] == [pwd.getpwuid(os.getuid()).pw_name]  # this test's process
        assert users[("host-b", 1)] == ["unknown"] and users[("host-a", 1)] == []
        # host-c: one row, unreachable since the newest sample it stored before it stopped.
        [c] = [h for h in snap.fleet.hosts if h.name == "host-c"]
        conn = open_ro(hosts["host-c"].db)
        stored_ts = {
            t for (t,) in conn.execute("SELECT ts_ms FROM gpu_samples UNION SELECT ts_ms FROM host_samples")
        }
        conn.close()
        assert round(c.last_sample_s * 1000) in stored_ts
        rows = _cells(screen)
        assert [r[0] for r in rows] == ["host-a", "host-a", "host-b", "host-b", "host-c"]
        assert rows[-1][6] == "down" and rows[-1][7].startswith("unreachable since ")
        painted = screen.query_one(RowList).render().plain.splitlines()
        assert painted[0].split() == ["HOST", "GPU", "UTIL", "MEM", "TEMP", "POWER", "STATE", "USERS"]
        assert painted[-1].startswith("host-c") and "unreachable since" in painted[-1]
        assert "3 hosts, 1 unreachable" in screen.query_one("#status").text.plain

        await pilot.press("f")  # only free GPUs: idle and nobody's process on them
        assert [(r[0], r[1]) for r in _cells(screen)] == [("host-a", "1"), ("host-b", "0")]
        await pilot.press("f", "slash", *"host-b", "enter")
        assert {r[0] for r in _cells(screen)} == {"host-b"}
        await pilot.press("enter")  # on a host's row: the command that opens its TUI
        assert screen.query_one("#fleet-hint").text.plain.endswith("ssh -t host-b gpuwatch tui")


@needs_prometheus
@pytest.mark.slow
@pilot_test
async def test_jobs_view_sums_a_two_host_job_over_its_ranks(fleet):
    url, hosts = fleet
    app = _fleet_app(url, hosts)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("j")
        await _fleet_shown(app, pilot, lambda snap: snap.fleet is not None and snap.fleet.jobs)
        [job] = app.screen.shown.fleet.jobs
        assert job.job_id == JOB and job.hosts == ("host-a", "host-b")
        assert [(r.host, r.rank, r.tokens_per_s) for r in job.ranks] == list(RANKS)
        assert job.tokens_per_s == sum(t for _, _, t in RANKS) == 3400
        # The runbook's recording rule, evaluated by Prometheus over both hosts' series, agrees.
        [summed] = _wait_for(
            int(url.rsplit(":", 1)[1]), "job_id:gpuwatch_run_tokens_per_second:sum", 1, Path("/dev/null")
        )
        assert summed["metric"]["job_id"] == JOB and float(summed["value"][1]) == 3400
        rows = _cells(app.screen)
        assert rows[0][0] == JOB and rows[0][3] == "2 hosts" and rows[0][5] == "3.4k"
        shares = {(r[3], r[4]): r[6] for r in rows[1:]}
        assert shares == {
            ("host-a", "0"): "29.4%",
            ("host-a", "1"): "29.4%",
            ("host-b", "2"): "29.4%",
            ("host-b", "3"): "11.8%",
        }
        table = app.screen.query_one(RowList)
        assert "red" in str(table.rows[4][1][6].style)  # the slow rank stands out; the others do not
        assert "red" not in str(table.rows[1][1][6].style)
        assert "11.8%" in table.render().plain  # and all of it fits on the 80x24 screen
        await pilot.press("end", "enter")  # the slow rank's host: the command that opens its TUI
        assert app.screen.query_one("#fleet-hint").text.plain.endswith("ssh -t host-b gpuwatch tui")


@needs_prometheus
@pytest.mark.slow
def test_every_dashboard_query_runs_on_a_real_prometheus(fleet):
    """The Grafana dashboard's queries parse and find series in Prometheus."""
    url, _ = fleet
    prom_port = int(url.rsplit(":", 1)[1])
    dashboard = json.loads((ROOT / "grafana" / "gpuwatch-runs.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$host", ".*")
            assert _query(prom_port, expr), f"{panel['title']}: {expr} finds nothing"


@needs_tools("promtool")
def test_promtool_accepts_the_rules_and_the_docs_show_them():
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 4 rules found" in check.stdout
    runbook = (ROOT / "docs" / "fleets.md").read_text()
    assert RULES.read_text() in runbook  # the runbook shows the file as it is


def _fits_from_store(hosts: dict, max_util: float, other_users_ok: bool) -> set:
    """(host, gpu) whose every stored sample fits: idle enough, 1 GiB free, no stranger's process."""
    fits = set()
    for name in ("host-a", "host-b"):
        for gpu in (0, 1):
            utils = _stored(hosts[name], "gpu_util_pct", gpu)
            free = _stored(hosts[name], "mem_free_bytes", gpu)
            stranger = (name, gpu) == ("host-b", 1)
            if max(utils) <= max_util and min(free) >= GIB and (other_users_ok or not stranger):
                fits.add((name, gpu))
    return fits


@needs_prometheus
@pytest.mark.slow
def test_pick_returns_only_the_gpus_that_fit(fleet):
    url, hosts = fleet
    runner = CliRunner()
    got = runner.invoke(main, ["pick", "--prometheus", url, "--mem", "1G", "--max-util", "10"])
    assert got.exit_code == 0, got.output
    lines = got.stdout.splitlines()
    assert lines == ["host-a 1", "host-b 0"] or lines == ["host-b 0", "host-a 1"]
    assert {(h, int(i)) for h, i in (line.split() for line in lines)} == _fits_from_store(hosts, 10, False)
    # Any utilisation: host-a's GPU 0 (this user's own process) fits; host-b's GPU 1 (a stranger's) never.
    got = runner.invoke(main, ["pick", "--prometheus", url, "--max-util", "100", "-n", "2"])
    assert got.exit_code == 0, got.output
    assert got.stdout.splitlines() == ["host-a 1,0"]  # best first: the idle GPU has more memory free
    # Nothing fits: exit 1, one line saying why.
    got = runner.invoke(main, ["pick", "--prometheus", url, "--mem", "500G"])
    assert got.exit_code == 1
    assert got.output.strip().count("\n") == 0
    assert "no GPU fits of 4 seen (4 too little free memory)" in got.output
    # Locally, from host-a's own store: the CUDA_VISIBLE_DEVICES line.
    got = runner.invoke(main, ["pick", "--db", str(hosts["host-a"].db)])
    assert got.exit_code == 0, got.output
    assert got.stdout.splitlines() == ["CUDA_VISIBLE_DEVICES=1"]


def test_choose_ranks_by_free_memory_then_utilisation_and_says_why_nothing_fits():
    cands = [
        Candidate(None, 0, 70 * GIB, 2.0),
        Candidate(None, 1, 79 * GIB, 5.0),
        Candidate(None, 2, 79 * GIB, 1.0),
        Candidate(None, 3, 79 * GIB, 50.0),
        Candidate(None, 4, 79 * GIB, 0.0, users=("bob",)),
        Candidate(None, 5, 79 * GIB, 0.0, lost=True),
        Candidate(None, 6, 10 * GIB, 0.0, users=("me",)),
    ]
    assert [[c.index for c in g] for g in choose(cands, 3, 40 * GIB, 10, "me")] == [[2, 1, 0]]
    with pytest.raises(
        NothingFits,
        match=r"no host has 4 GPUs that fit of 7 seen \(1 busy \(utilisation "
        r"> 10 %\), 1 another user's process, 1 lost, 1 too little free "
        r"memory\); fitting: this host has 3",
    ):
        choose(cands, 4, 40 * GIB, 10, "me")
    with pytest.raises(NothingFits, match="no GPU samples in the window"):
        choose([], 1, 0, 10, "me")


# -- a Prometheus that misbehaves ---------------------------------------------------------------


class _Broken(http.server.BaseHTTPRequestHandler):
    mode = "500"

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.mode == "slow":
            time.sleep(3)
        body = {
            "500": b'{"status":"error","errorType":"internal","error":"query processing failed"}',
            "garbage": b"<html>login</html>",
            "slow": b"{}",
        }[self.mode]
        self.send_response(500 if self.mode == "500" else 200)
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def broken_prometheus():
    servers = []

    def start(mode: str) -> str:
        handler = type("Handler", (_Broken,), {"mode": mode})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.mark.parametrize(
    "mode, says",
    [
        ("unreachable", "is unreachable: Connection refused"),
        ("500", "answered HTTP 500: query processing failed"),
        ("slow", "did not answer within 1 s"),
        ("garbage", "sent an answer that is not a Prometheus query result"),
    ],
)
def test_a_broken_prometheus_is_one_clear_line_in_pick_and_the_tui(broken_prometheus, mode, says, tmp_path):
    url = f"http://127.0.0.1:{_free_port()}" if mode == "unreachable" else broken_prometheus(mode)
    started = time.monotonic()
    got = CliRunner().invoke(main, ["pick", "--prometheus", url], env={"GPUWATCH_PROMETHEUS_TIMEOUT": "1"})
    assert got.exit_code == 1
    assert got.output.strip().count("\n") == 0 and says in got.output and "Traceback" not in got.output
    assert time.monotonic() - started < 5

    @pilot_test
    async def tui():
        app = GpuwatchApp(
            StoreSource(str(tmp_path / "none.db")),
            refresh_s=30,
            start_mode="fleet",
            fleet=PrometheusSource(url, timeout_s=1),
        )
        async with app.run_test(size=(80, 24)) as pilot:
            await _fleet_shown(app, pilot)
            status = app.screen.query_one("#status").text.plain
            assert says in status and "\n" not in status
            assert app.screen.query_one(RowList).rows == []

    tui()


@pilot_test
async def test_fleet_screen_without_prometheus_says_how_to_get_one(tmp_path):
    app = GpuwatchApp(StoreSource(str(tmp_path / "none.db")), refresh_s=30)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("F")
        await _fleet_shown(app, pilot)
        assert "gpuwatch tui --prometheus URL" in app.screen.query_one("#status").text.plain


def test_run_pick_sets_cuda_visible_devices_for_the_command():
    """`gpuwatch run --pick 1` runs the command on this host's free GPU; --pick 3 is refused."""
    import sys

    from gpuwatch.base import paths

    ts = now_ms()
    conn = open_rw(paths.default_db_path(system=False))
    insert_rows(
        conn,
        "gpus",
        [dict(gpu_index=i, uuid=f"GPU-{i}", first_seen_ms=ts, last_seen_ms=ts) for i in range(2)],
    )
    insert_rows(
        conn,
        "gpu_samples",
        [
            dict(gpu_index=i, ts_ms=ts - 1000 * k, gpu_util_pct=90 - 90 * i, mem_free_bytes=70 * GIB)
            for i in range(2)
            for k in range(30)
        ],
    )
    conn.close()
    gpuwatch = str(Path(sys.executable).with_name("gpuwatch"))
    child = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"
    out = subprocess.run(
        [gpuwatch, "run", "--pick", "1", "--", sys.executable, "-c", child],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
    conn = open_ro(paths.default_db_path(system=False))
    assert conn.execute("SELECT gpu_uuids FROM runs").fetchone() == ("1",)
    conn.close()
    out = subprocess.run(
        [gpuwatch, "run", "--pick", "3", "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == (
        "Error: --pick 3: no host has 3 GPUs that fit of 2 seen "
        "(1 busy (utilisation > 10 %)); fitting: this host has 1"
    )

"""Energy per run against a case worked out by hand: the real sampler writes the fake NVML's
energy counter (a fixed 300 W on GPU 0, 301 W on GPU 1) while two runs share GPU 0 for a while."""

from __future__ import annotations

import html
import json
import re
import time
import urllib.request

import fake_pynvml
import pytest
from click.testing import CliRunner
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from gpuwatch.base.config import Config
from gpuwatch.cli import main
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer, open_ro
from gpuwatch.store.energy import EnergyLedger, run_energy
from gpuwatch.tui.snapshot import View
from gpuwatch.tui.source import StoreSource

T0 = 1_700_000_000_000
PID_A, PID_B = fake_pynvml.FAKE_PID_BASE + 1, fake_pynvml.FAKE_PID_BASE + 2
TOKENS_A = 60 * 1000

# Worked by hand, in joules. Each interval between two GPU samples is charged to the processes
# seen at its start. GPU 0 (300 J/s): A alone 0-20 s, A and B 20-40 s, A alone 40-60 s, nobody
# after. GPU 1 (301 J/s): B alone 20-40 s. The counter resets at 30 s: 29-30 s is unknown on
# both GPUs. No samples at all 45-49 s: the counter still gives 44-50 s exactly, A's alone.
HAND_A = 300 * 20 + (300 * 20 - 300) / 2 + 300 * 20  # 14,850 J
HAND_B = (300 * 20 - 300) / 2 + 301 * 20 - 301  # 8,569 J


@pytest.fixture
def energy_db(tmp_path):
    return record(tmp_path / "gw.db", seconds=81, a_ended=True)


def record(path, seconds: int, a_ended: bool):
    """The sampler ticked each second for `seconds` s; run A ended at 60 s, or is still running."""
    writer = Writer(path)
    ms = [T0]
    nvml = fake_pynvml.FakeNvml(gpus=2, clock=lambda: ms[0] / 1000)
    sampler = Sampler(writer, Config(), nvml_module=nvml, clock=lambda: ms[0])
    writer.insert(
        "runs",
        [
            dict(
                run_id="run-a",
                name="lr-1e-3",
                uid=1000,
                user="alice",
                pid=PID_A,
                status="finished" if a_ended else "running",
                started_ms=T0,
                ended_ms=T0 + 60_000 if a_ended else None,
                host="node1",
            ),
            dict(
                run_id="run-b",
                name="lr-1e-2",
                uid=1000,
                user="alice",
                pid=PID_B,
                status="finished",
                started_ms=T0 + 20_000,
                ended_ms=T0 + 40_000,
                host="node1",
            ),
        ],
    )
    writer.insert(
        "steps",
        [
            dict(
                run_id="run-a",
                step=k + 1,
                ts_ms=T0 + k * 1000 + 500,
                tokens=1000,
                step_time_ms=1000.0,
                tokens_per_s=1000.0,
                loss=5.0 - 0.05 * k,
            )
            for k in range(60)
        ],
    )
    for second in range(seconds):
        if 45 <= second <= 49:
            continue  # the daemon missed these ticks
        ms[0] = T0 + second * 1000
        if second == 30:
            nvml.loaded_at = ms[0] / 1000  # the driver reloaded: the counter starts again at 0
        both = 20 <= second < 40
        nvml.set_procs(0, ([PID_A] + ([PID_B] if both else [])) if second < 60 else [])
        nvml.set_procs(1, [PID_B] if both else [])
        sampler.gpu_tick()
    writer.flush()
    writer.close()
    return path


def test_energy_per_run_matches_the_hand_computed_case(energy_db):
    conn = open_ro(energy_db)
    try:
        found = run_energy(conn, {"run-a": (T0, T0 + 60_000), "run-b": (T0 + 20_000, T0 + 40_000)})
    finally:
        conn.close()
    assert found["run-a"].joules == pytest.approx(HAND_A, rel=0.01)
    assert found["run-b"].joules == pytest.approx(HAND_B, rel=0.01)
    assert found["run-a"].gpus == (0,) and found["run-b"].gpus == (0, 1)
    assert found["run-a"].complete and found["run-a"].kwh == pytest.approx(HAND_A / 3.6e6, rel=0.01)


def test_a_ledger_folded_a_few_seconds_at_a_time_agrees(energy_db):
    """What /metrics does: each scrape folds only the seconds since the previous one."""
    conn = open_ro(energy_db)
    try:
        ledger = EnergyLedger(T0 - 15_000)
        for until in range(T0 - 10_000, T0 + 90_000, 3_700):
            ledger.fold(conn, until)
        ledger.fold(conn, T0 + 90_000)
    finally:
        conn.close()
    assert ledger.joules["run-a"] == pytest.approx(HAND_A, rel=0.01)
    assert ledger.joules["run-b"] == pytest.approx(HAND_B, rel=0.01)
    # What the TUI does for the run on screen: folds of a second, most holding no process tick.
    conn = open_ro(energy_db)
    try:
        only_a = EnergyLedger(T0 - 15_000)
        for until in range(T0 - 10_000, T0 + 90_000, 1_000):
            only_a.fold(conn, until, runs=["run-a"])
    finally:
        conn.close()
    assert only_a.joules["run-a"] == pytest.approx(HAND_A, rel=0.01)


def _figure(text: str, unit: str) -> float:
    return float(re.search(r"([\d.]+) " + re.escape(unit), text).group(1))


def test_show_and_compare_give_kwh_and_joules_per_token(energy_db):
    shown = CliRunner().invoke(main, ["show", "run-a", "--db", str(energy_db)])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if x.strip().startswith("energy"))
    assert _figure(line, "kWh") == pytest.approx(HAND_A / 3.6e6, rel=0.01)
    assert _figure(line, "J/token") == pytest.approx(HAND_A / TOKENS_A, rel=0.01)
    assert "GPU 0" in line

    compared = CliRunner().invoke(main, ["compare", "run-a", "run-b", "--json", "--db", str(energy_db)])
    assert compared.exit_code == 0, compared.output
    a, b = json.loads(compared.output)
    assert a["energy_j"] == pytest.approx(HAND_A, rel=0.01) and b["energy_j"] == pytest.approx(
        HAND_B, rel=0.01
    )
    assert a["joules_per_token"] == pytest.approx(HAND_A / TOKENS_A, rel=0.01)
    assert b["joules_per_token"] is None  # no tokens recorded
    table = CliRunner().invoke(main, ["compare", "run-a", "run-b", "--db", str(energy_db)]).output
    energy_row = next(x for x in table.splitlines() if x.startswith("energy"))
    assert _figure(energy_row, "kWh") == pytest.approx(HAND_A / 3.6e6, rel=0.01)

    report = energy_db.parent / "a.html"
    assert (
        CliRunner().invoke(main, ["report", "run-a", "-o", str(report), "--db", str(energy_db)]).exit_code
        == 0
    )
    cells = re.findall(r"<td>(energy[^<]*)</td><td>([^<]*)</td>", report.read_text())
    assert dict(cells)["energy"].endswith("kWh") and dict(cells)["energy/token"].endswith("J/token")
    assert _figure(dict(cells)["energy"], "kWh") == pytest.approx(HAND_A / 3.6e6, rel=0.01)
    assert _figure(dict(cells)["energy/token"], "J/token") == pytest.approx(HAND_A / TOKENS_A, rel=0.01)


def test_a_run_whose_early_samples_expired_says_its_energy_is_partial(energy_db):
    conn = open_ro(energy_db)
    try:
        # As if the run had started a minute before the oldest raw sample kept.
        found = run_energy(conn, {"run-a": (T0 - 60_000, T0 + 60_000)})
    finally:
        conn.close()
    assert not found["run-a"].complete and found["run-a"].from_ms >= T0


@pilot_test
async def test_the_run_screen_shows_energy_and_the_loss_chart(energy_db):
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.screens.run import RunScreen

    source = StoreSource(str(energy_db), clock=lambda: T0 + 90_000)
    detail = source.fetch(View("run", run_id="run-a")).detail
    assert detail.energy_j == pytest.approx(HAND_A, rel=0.01)
    assert detail.joules_per_token == pytest.approx(HAND_A / TOKENS_A, rel=0.01)
    assert [c.title for c in detail.charts][:2] == ["tokens/s", "loss"]
    assert source.fetch(View("run", run_id="run-a")).detail.energy_j == detail.energy_j  # folded once
    app = GpuwatchApp(source, refresh_s=60, start_mode="runs")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.2)
        app.push_screen(RunScreen("run-a"))
        await pilot.pause(0.3)
        screen = html.unescape(re.sub(r"<[^>]+>", "", app.export_screenshot())).replace("\xa0", " ")
        line = screen[screen.index("energy") :][:60]
        assert _figure(line, "kWh") == pytest.approx(HAND_A / 3.6e6, rel=0.01)
        assert _figure(line, "J/token") == pytest.approx(HAND_A / TOKENS_A, rel=0.01)


def test_metrics_export_a_running_runs_energy_as_a_counter(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from gpuwatch.daemon.metrics import start_metrics_server

    # A still running at 59 s: its last second is 58-59 s, B ended at 40 s (not exported).
    path = record(tmp_path / "live.db", seconds=60, a_ended=False)
    hand = 300 * 20 + (300 * 20 - 300) / 2 + 300 * 19
    server = start_metrics_server("127.0.0.1:0", path)
    try:
        text = ""
        for _ in range(200):  # the first scrape starts folding the run's history in a thread
            with urllib.request.urlopen(server.url, timeout=10) as resp:
                text = resp.read().decode()
            if "gpuwatch_run_energy_joules_total{" in text:
                break
            time.sleep(0.01)
    finally:
        server.close()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "gpuwatch_run_energy_joules"]
    assert family.type == "counter"
    (sample,) = family.samples
    assert sample.name == "gpuwatch_run_energy_joules_total"
    assert sample.labels["run_id"] == "run-a" and sample.labels["name"] == "lr-1e-3"
    assert sample.value == pytest.approx(hand, rel=0.01)


def test_a_fresh_exporter_shows_a_long_runs_energy_once_it_has_caught_up(tmp_path):
    from gpuwatch.daemon.metrics import start_metrics_server
    from gpuwatch.store import insert_rows, now_ms, open_rw

    path, now, seconds = tmp_path / "long.db", now_ms(), 2400  # 40 min: folded in pieces
    start = now - seconds * 1000
    conn = open_rw(path)
    insert_rows(conn, "gpus", [dict(gpu_index=0, uuid="GPU-0", first_seen_ms=start, last_seen_ms=now)])
    insert_rows(
        conn,
        "runs",
        [dict(run_id="long", name="long", uid=1000, pid=PID_A, status="running", started_ms=start)],
    )
    insert_rows(
        conn,
        "gpu_samples",
        [dict(gpu_index=0, ts_ms=start + 1000 * s, energy_mj=300_000 * s) for s in range(seconds + 1)],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [dict(gpu_index=0, pid=PID_A, ts_ms=start + 5000 * k) for k in range(seconds // 5 + 1)],
    )
    conn.close()
    server = start_metrics_server("127.0.0.1:0", path)
    try:
        seen = []
        while len(seen) < 200 and (not seen or seen[-1] is None):
            with urllib.request.urlopen(server.url, timeout=10) as resp:
                text = resp.read().decode()
            match = re.search(r'^gpuwatch_run_energy_joules_total\{.*run_id="long".*\} (\S+)$', text, re.M)
            seen.append(match and float(match.group(1)))
            time.sleep(0.01)
    finally:
        server.close()
    # Nothing partial while its history is folded (in a thread: scrapes never wait), then all of it.
    assert seen[:-1] == [None] * (len(seen) - 1)
    assert seen[-1] == pytest.approx(300 * seconds, rel=0.01)


def test_a_process_of_no_run_keeps_its_share_and_one_kernel_runs_two_runs_in_turn(tmp_path):
    """GPU 0 at 100 W for 10 s with two processes all along: a Jupyter kernel (pid K) that ran
    run one for 0-4 s and run two for 4-10 s, and a process of no run. Half the energy is the
    kernel's, split by time between its runs; the other half is nobody's."""
    from gpuwatch.store import insert_rows, open_rw

    path = tmp_path / "shared.db"
    conn = open_rw(path)
    kernel, stray = 7001, 7002
    insert_rows(
        conn,
        "runs",
        [
            dict(run_id="one", uid=1, pid=kernel, status="finished", started_ms=T0, ended_ms=T0 + 4_000),
            dict(
                run_id="two",
                uid=1,
                pid=kernel,
                status="finished",
                started_ms=T0 + 4_000,
                ended_ms=T0 + 10_000,
            ),
        ],
    )
    insert_rows(
        conn,
        "gpu_samples",
        [dict(gpu_index=0, ts_ms=T0 + 1000 * s, energy_mj=100_000 * s) for s in range(11)],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [dict(gpu_index=0, pid=pid, ts_ms=T0 + 5000 * k) for k in range(3) for pid in (kernel, stray)],
    )
    conn.close()
    conn = open_ro(path)
    try:
        found = run_energy(conn, {"one": (T0, T0 + 4_000), "two": (T0 + 4_000, T0 + 10_000)})
    finally:
        conn.close()
    assert found["one"].joules == pytest.approx(100 * 4 / 2)
    assert found["two"].joules == pytest.approx(100 * 6 / 2)

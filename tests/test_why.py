"""`gpuwatch why`: slowdowns found per token and traced to their injected cause, on hand-built
databases written as the daemon writes them (tests/why_scenarios.py), and one real tracked run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from why_scenarios import SLOW_FROM, SLOW_TO, T0, Scenario

from gpuwatch.analysis.why import analyse, top_cause
from gpuwatch.cli import main
from gpuwatch.store import open_ro, open_rw


def why(sc: Scenario, tmp_path, run: str = "r"):
    path = sc.write(tmp_path / "why.db")
    conn = open_ro(path)
    try:
        return analyse(conn, run)
    finally:
        conn.close()


def the_slowdown(result, factor: float):
    """The one slowdown, over the injected window, about as much slower as injected."""
    assert len(result.slowdowns) == 1, result.slowdowns
    s = result.slowdowns[0]
    assert abs(s.start_ms - (T0 + SLOW_FROM * 1000)) < 3000 and abs(s.end_ms - (T0 + SLOW_TO * 1000)) < 3000
    assert s.slower_pct == pytest.approx((factor - 1) * 100, abs=6)
    return s


SINGLE = [
    # injection, its step-time factor, expected first cause: kind, pid, gpu_index
    ("cotenant", 1.6, "gpu_cotenant", 8812, 0),
    ("cpu_hog", 1.5, "host_cpu", 7777, None),
    ("throttle", 1.4, "gpu_throttle", None, 0),
    ("swapping", 1.5, "host_swap", 5555, None),
    ("data_loader_sleeps", 1.6, "data_wait", None, None),
    ("profiler_window", 1.5, "profiler", None, None),
]


@pytest.mark.parametrize("inject, factor, kind, pid, gpu", SINGLE, ids=[s[0] for s in SINGLE])
def test_each_injected_cause_is_found_and_ranked_first(tmp_path, inject, factor, kind, pid, gpu):
    sc = Scenario()
    getattr(sc, inject)()
    s = the_slowdown(why(sc, tmp_path), factor)
    first = s.causes[0]
    assert (first.kind, first.pid, first.gpu_index) == (kind, pid, gpu), s.causes
    assert first.share_pct >= (50 if kind == "profiler" else 60), s.causes


def test_a_profile_is_a_phase_over_the_steps_it_traced(tmp_path):
    sc = Scenario()
    sc.profiler_window()
    result = why(sc, tmp_path)
    (profile,) = [p for p in result.phases if p.kind == "profiler"]
    assert (profile.first_step, profile.last_step) == (211, 290)
    assert profile.end_ms - profile.start_ms >= 50_000


def test_a_cotenant_names_the_process_its_user_memory_and_sm(tmp_path):
    sc = Scenario()
    sc.cotenant()
    first = the_slowdown(why(sc, tmp_path), 1.6).causes[0]
    assert (first.user, first.command) == ("bob", "python other.py")
    assert "10.0 GiB" in first.detail and "SM 40 %" in first.detail


def test_a_cpu_hog_says_how_much_of_the_host_it_took(tmp_path):
    sc = Scenario()
    sc.cpu_hog()
    first = the_slowdown(why(sc, tmp_path), 1.5).causes[0]
    assert (first.user, first.command) == ("carol", "python preprocess.py")
    assert "host CPU 9" in first.detail and "(was 3" in first.detail


def test_throttling_gives_its_reason_clock_and_power(tmp_path):
    sc = Scenario()
    sc.throttle()
    first = the_slowdown(why(sc, tmp_path), 1.4).causes[0]
    assert "power cap" in first.detail and "-> 14" in first.detail and "700 W cap" in first.detail


PAIRS = [
    ("cotenant", "cpu_hog", {"gpu_cotenant", "host_cpu"}),
    ("throttle", "data_loader_sleeps", {"gpu_throttle", "data_wait"}),
    ("swapping", "cotenant", {"host_swap", "gpu_cotenant"}),
    ("cpu_hog", "throttle", {"host_cpu", "gpu_throttle"}),
]


@pytest.mark.parametrize("a, b, kinds", PAIRS, ids=[f"{a}+{b}" for a, b, _ in PAIRS])
def test_two_causes_at_once_are_both_found_and_ranked_above_the_rest(tmp_path, a, b, kinds):
    sc = Scenario()
    getattr(sc, a)()
    getattr(sc, b)()
    result = why(sc, tmp_path)
    assert len(result.slowdowns) == 1, result.slowdowns
    causes = result.slowdowns[0].causes
    assert {c.kind for c in causes[:2]} == kinds, causes
    assert all(c.share_pct >= 15 for c in causes[:2]), causes


def test_a_straggling_rank_is_named_with_what_slowed_it(tmp_path):
    sc = Scenario()
    sc.second_rank(straggling_cotenant=True)
    s = the_slowdown(why(sc, tmp_path), 1.5)
    first = s.causes[0]
    assert (first.kind, first.pid, first.gpu_index) == ("straggler_rank", 9911, 1), s.causes
    assert "rank 1 (run r1)" in first.detail
    # Seen from the slow rank itself, the co-tenant on its own GPU comes first.
    own = the_slowdown(_again(sc, tmp_path, "r1"), 1.5)
    assert own.causes[0].kind == "gpu_cotenant" and own.causes[0].pid == 9911


def _again(sc: Scenario, tmp_path, run: str):
    conn = open_ro(tmp_path / "why.db")
    try:
        return analyse(conn, run)
    finally:
        conn.close()


@pytest.mark.parametrize("seed", range(1, 6))
@pytest.mark.parametrize("noise", [0.03, 0.2])
def test_steady_runs_report_no_slowdown(tmp_path, seed, noise):
    result = why(Scenario(seed=seed, noise=noise), tmp_path)
    assert result.slowdowns == ()
    long_slow = [
        p
        for p in result.phases
        if p.kind == "slow" and (p.slower_pct or 0) >= 20 and p.end_ms - p.start_ms >= 10_000
    ]
    assert long_slow == []


def test_a_longer_sequence_is_not_a_slowdown_per_token(tmp_path):
    sc = Scenario()
    sc.sequence_length_doubles()
    assert why(sc, tmp_path).slowdowns == ()


def test_evaluation_pauses_are_pauses_not_slowdowns(tmp_path):
    sc = Scenario()
    sc.evaluation_pauses()
    result = why(sc, tmp_path)
    assert result.slowdowns == ()
    assert result.pauses >= 3 and result.pause_ms >= 3 * 20_000
    assert [p.first_step // 100 for p in result.phases if p.kind == "pause"][:3] == [1, 2, 3]


def test_thirty_percent_for_fifteen_seconds_is_always_reported(tmp_path):
    sc = Scenario(window=(150, 165))
    sc.cotenant(factor=1.3)
    result = why(sc, tmp_path)
    assert len(result.slowdowns) == 1, result.phases
    s = result.slowdowns[0]
    assert s.slower_pct >= 25 and s.end_ms - s.start_ms >= 12_000
    assert s.causes[0].kind == "gpu_cotenant"


def test_a_slowdown_shorter_than_ten_seconds_is_not_reported(tmp_path):
    sc = Scenario(window=(150, 157))
    sc.cotenant(factor=1.5)
    assert why(sc, tmp_path).slowdowns == ()


def test_top_cause_of_a_window_for_the_alert_rule(tmp_path):
    sc = Scenario()
    sc.cpu_hog()
    path = sc.write(tmp_path / "why.db")
    conn = open_ro(path)
    try:
        cause = top_cause(conn, "r", T0 + 130_000, T0 + 170_000)
        steady = top_cause(conn, "r", T0 + 200_000, T0 + 260_000)
    finally:
        conn.close()
    assert cause is not None and (cause.kind, cause.pid) == ("host_cpu", 7777)
    assert steady is None or steady.kind == "unexplained"


def test_cli_json_has_the_documented_shape(tmp_path):
    sc = Scenario()
    sc.cotenant()
    path = sc.write(tmp_path / "why.db")
    out = CliRunner().invoke(main, ["why", "--db", str(path), "r", "--format", "json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert list(doc) == ["run", "slowdowns"] and doc["run"] == "r"
    (s,) = doc["slowdowns"]
    assert list(s) == ["start_ms", "end_ms", "first_step", "last_step", "slower_pct", "causes"]
    assert list(s["causes"][0]) == ["kind", "share_pct", "pid", "user", "command", "gpu_index", "detail"]
    assert (s["causes"][0]["kind"], s["causes"][0]["pid"], s["causes"][0]["user"]) == (
        "gpu_cotenant",
        8812,
        "bob",
    )


def test_cli_table_lists_phases_and_causes_and_names_a_bad_run(tmp_path):
    sc = Scenario()
    sc.throttle()
    path = sc.write(tmp_path / "why.db")
    out = CliRunner().invoke(main, ["why", "--db", str(path), "r"])
    assert out.exit_code == 0, out.output
    assert "warm-up" in out.output and "steady" in out.output and "40 % slower per token" in out.output
    assert "gpu_throttle" in out.output
    bad = CliRunner().invoke(main, ["why", "--db", str(path), "nope"])
    assert bad.exit_code == 1 and "nope" in bad.output and len(bad.output.strip().splitlines()) == 1


# Seconds of steady steps, of steps beside the hogs, and of steady steps again. The hogged
# phase is MIN_SLOW_MS (the shortest slowdown `why` reports) and a few bins to spare: a bin holds
# a second of the run's typical steps, so the hogs' 3-4x slower steps fill one every 3-4 s, and `why`
# needs two whole ones. (Halving both, 8 s beside the hogs, found nothing in 2 runs of 6.) The
# steady phases are long enough for a warm-up (at most a fifth of the run) and a base.
STEADY_S, HOGGED_S, AFTER_S = 8, 14, 4
HOGGED_RUN = f"""
import json, os, subprocess, sys, time
import gpuwatch

# A fixed amount of CPU work per step (~2.5 ms) and no sleep: the kernel favours a process that
# sleeps often, and the hogs would hardly slow it (4 % with half of each step a sleep, at load 5).
def work():
    x = 0
    for i in range(60_000):
        x += i * i
    return x

def steps_for(run, seconds):
    end = time.time() + seconds
    while time.time() < end:
        work()
        run.step(tokens=1024)

with gpuwatch.track(name="hogged") as run:
    steps_for(run, {STEADY_S})
    hog_from = time.time()
    # Enough busy processes to saturate any host, whatever else runs there: every core, and four more.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() + 4)]
    steps_for(run, {HOGGED_S})
    for h in hogs:
        h.kill()
        h.wait()
    hog_to = time.time()
    steps_for(run, {AFTER_S})
print(json.dumps({{"run": run.run_id, "from": int(hog_from * 1000), "to": int(hog_to * 1000)}}))
"""


@pytest.mark.slow(28)
def test_a_real_tracked_run_slowed_by_cpu_hogs(tmp_path):
    """gpuwatch.track + step in embedded mode (its sampler writes the host's samples), while
    busy processes (one per core, and four more) compete for the CPU for 14 s: the slowdown is
    found over their window and the host's CPU is its first cause."""
    import subprocess
    import sys

    from gpuwatch.base import paths

    done = subprocess.run([sys.executable, "-c", HOGGED_RUN], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    conn = open_ro(paths.default_db_path(system=False))
    try:
        result = analyse(conn, info["run"])
    finally:
        conn.close()
    hog = info["to"] - info["from"]
    over = [
        s for s in result.slowdowns if min(s.end_ms, info["to"]) - max(s.start_ms, info["from"]) >= 0.6 * hog
    ]
    assert over, (result.phases, info)
    assert over[0].slower_pct >= 30
    assert over[0].causes[0].kind == "host_cpu", over[0].causes


def test_show_and_report_carry_the_slowdowns(tmp_path):
    sc = Scenario()
    sc.cotenant()
    path = sc.write(tmp_path / "why.db")
    shown = CliRunner().invoke(main, ["show", "--db", str(path), "r"])
    assert shown.exit_code == 0, shown.output
    section = shown.output.split("slowdowns (gpuwatch why")[1]
    assert "60 % slower per token" in section and "gpu_cotenant" in section and "pid 8812 (bob" in section
    html = tmp_path / "r.html"
    reported = CliRunner().invoke(main, ["report", "--db", str(path), "r", "-o", str(html)])
    assert reported.exit_code == 0, reported.output
    page = html.read_text()
    assert "<h2>Slowdowns</h2>" in page and "gpu_cotenant" in page and "python other.py" in page


def test_show_of_a_steady_run_says_none(tmp_path):
    path = Scenario().write(tmp_path / "why.db")
    shown = CliRunner().invoke(main, ["show", "--db", str(path), "r"])
    assert shown.exit_code == 0, shown.output
    assert "none (no phase 20 % or more slower per token" in shown.output.split("slowdowns (gpuwatch why")[1]


def test_compare_says_where_a_run_was_slower_per_token_and_why(tmp_path):
    sc = Scenario(seconds=600)
    sc.later_run_beside_a_cotenant()
    path = sc.write(tmp_path / "why.db")
    out = CliRunner().invoke(main, ["compare", "--db", str(path), "r", "b"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("train-b: steady speed"))
    assert "50 % slower per token than train" in line
    why_lines = out.output.split(line)[1].splitlines()
    assert "gpu_cotenant" in why_lines[1] and "pid 8813 (bob" in why_lines[1]


def test_the_tui_run_screen_shades_the_slow_phase_and_lists_its_causes(tmp_path):
    import asyncio

    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.chart import SHADE, render_chart
    from gpuwatch.tui.screens.run import RunScreen
    from gpuwatch.tui.snapshot import View
    from gpuwatch.tui.source import StoreSource

    sc = Scenario()
    sc.cotenant()
    path = sc.write(tmp_path / "why.db")
    source = StoreSource(str(path), clock=lambda: T0 + 300_000)
    detail = source.fetch(View("run", run_id="r")).detail
    (slow,) = detail.slowdowns
    assert slow.causes[0].startswith("100 % gpu_cotenant: ") and "pid 8812 (bob" in slow.causes[0]
    chart = next(c for c in detail.charts if c.title == "step time")
    assert chart.shaded == ((slow.start_ms, slow.end_ms),)
    drawn = render_chart(chart, 60, 8, T0 + 300_000)
    shaded = [s for s in drawn.spans if SHADE in str(s.style)]
    # The slow minute of the five shown: about a fifth of the plot's columns, in its middle.
    row = drawn.plain.splitlines()[2]
    columns = {
        s.start - drawn.plain.index(row)
        for s in shaded
        if drawn.plain.index(row) <= s.start < drawn.plain.index(row) + len(row)
    }
    assert 8 <= len(columns) <= 14 and min(columns) > 15 and max(columns) < 45, sorted(columns)

    async def pilot():
        app = GpuwatchApp(source, refresh_s=60, start_mode="runs")
        async with app.run_test(size=(100, 40)) as p:
            app.push_screen(RunScreen("r"))
            await p.pause(0.5)
            text = str(app.screen.query_one("#run-slowdowns").render())
            assert "60 % slower per token" in text and "gpu_cotenant" in text

    asyncio.run(pilot())


def test_a_run_without_tokens_is_measured_per_step(tmp_path):
    sc = Scenario(tokens=None)
    sc.cotenant()
    result = why(sc, tmp_path)
    assert result.unit == "step"
    assert the_slowdown(result, 1.6).causes[0].kind == "gpu_cotenant"


def test_folded_rows_count_as_the_steps_they_stand_for(tmp_path):
    sc = Scenario(fold=4)
    sc.throttle()
    result = why(sc, tmp_path)
    s = the_slowdown(result, 1.4)
    assert s.causes[0].kind == "gpu_throttle"
    assert sum(p.steps for p in result.phases if p.kind != "pause") == result.phases[-1].last_step


def test_a_slow_warm_up_is_warm_up_not_a_slowdown(tmp_path):
    result = why(Scenario(warmup_s=45), tmp_path)  # the compiled first step, then 29 s at half speed
    assert result.slowdowns == ()
    assert (
        result.phases[0].kind == "warm-up" and result.phases[0].end_ms - result.phases[0].start_ms >= 15_000
    )


def test_a_run_with_no_steps_has_nothing_to_say(tmp_path):
    sc = Scenario()
    path = sc.write(tmp_path / "why.db")
    conn = open_rw(path)
    conn.execute("DELETE FROM steps")
    conn.commit()
    conn.close()
    table = CliRunner().invoke(main, ["why", "--db", str(path), "r"])
    assert table.exit_code == 0 and "no timed steps" in table.output
    doc = json.loads(CliRunner().invoke(main, ["why", "--db", str(path), "r", "--format", "json"]).output)
    assert doc == {"run": "r", "slowdowns": []}


def test_neither_the_daemon_nor_the_client_loads_the_analysis():
    import subprocess
    import sys

    code = (
        "import sys, gpuwatch.daemon.main, gpuwatch.client, gpuwatch.monitor.sampler\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpuwatch.analysis.why')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

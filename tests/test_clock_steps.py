"""The wall clock stepped back an hour and forward a day (an NTP correction, a VM resumed)
while monotonic time moves on: through the real Sampler, Writer, maintain(), TUI source and
client, nothing is lost or counted twice and no duration or rate goes wrong."""

from __future__ import annotations

import sqlite3
import time

import fake_pynvml
import pytest

import gpuwatch
from gpuwatch.base import clock, paths
from gpuwatch.base.config import Config
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import Writer, insert_rows, now_ms, queries
from gpuwatch.tui.snapshot import View
from gpuwatch.tui.source import StoreSource

S, MIN, H, DAY = 1000, 60_000, 3_600_000, 86_400_000
TICK_S = 5  # one sample every 5 s keeps hours of ticks quick
START = 472_222 * H


class Clocks:
    """Wall time that a test steps, and monotonic time that only moves forward."""

    def __init__(self) -> None:
        self.wall, self.mono = START, 1000.0

    def wall_ms(self) -> int:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += round(seconds * 1000)
        self.mono += seconds


@pytest.fixture
def daemon(tmp_path):
    """The daemon's sampler and writer on injected clocks, 2 GPUs (simulated), 1 h raw window."""
    clocks = Clocks()
    path = tmp_path / "gw.db"
    writer = Writer(path)
    # The GPUs' readings move with the time that really passes, not with the wall clock.
    nvml = fake_pynvml.FakeNvml(gpus=2, procs_per_gpu=1, clock=clocks.monotonic)
    sampler = Sampler(
        writer,
        Config(raw_retention_hours=1.0, process_interval=float(TICK_S)),
        nvml_module=nvml,
        clock=clocks.wall_ms,
        monotonic=clocks.monotonic,
    )
    yield clocks, sampler, writer, sqlite3.connect(path)
    nvml.nvmlShutdown()
    writer.close()


def run_for(clocks: Clocks, sampler: Sampler, writer: Writer, minutes: int) -> None:
    """Sample every TICK_S and maintain every minute, as the daemon's scheduler does."""
    for t in range(minutes * 60 // TICK_S):
        sampler.tick()
        clocks.advance(TICK_S)
        if (t + 1) % (60 // TICK_S) == 0:
            sampler.maintenance_tick()
    writer.flush()


def rollups(conn: sqlite3.Connection) -> set[tuple]:
    return {
        row
        for tier in ("gpu_samples_15m", "gpu_samples_1h", "host_samples_15m", "host_samples_1h")
        for row in conn.execute(f"SELECT '{tier}', * FROM {tier}")
    }


def samples_between(conn: sqlite3.Connection, since: int, until: int, table: str = "gpu_samples") -> int:
    return conn.execute(
        f"SELECT count(*) FROM {table} WHERE ts_ms >= ? AND ts_ms < ?", (since, until)
    ).fetchone()[0]


def test_rollups_and_retention_survive_a_step_back_and_a_step_forward(daemon):
    clocks, sampler, writer, conn = daemon
    per_period = 15 * 60 // TICK_S  # samples a complete 15-minute row holds
    run_for(clocks, sampler, writer, 90)
    before_back = rollups(conn)
    assert len([r for r in before_back if r[0] == "gpu_samples_15m"]) == 2 * 5  # 2 GPUs, 75 min rolled
    last_hour = (clocks.wall - 50 * MIN, clocks.wall)
    kept = samples_between(conn, *last_hour)
    assert kept == 2 * 50 * 60 // TICK_S
    kept_processes = samples_between(conn, *last_hour, table="gpu_process_samples")
    assert kept_processes == kept  # one process per GPU, a row a tick

    # Stepped back exactly an hour: every tick now falls on an earlier sample's millisecond.
    clocks.wall -= H
    run_for(clocks, sampler, writer, 30)
    after_back = rollups(conn)
    assert before_back <= after_back  # none deleted or changed
    assert all(row[3] <= per_period for row in after_back if row[0].endswith("_15m"))  # none doubled
    # Nothing expired early, and the 20 of those 30 minutes that fall in that hour are there too.
    assert samples_between(conn, *last_hour) == kept + 2 * 20 * 60 // TICK_S
    assert (
        samples_between(conn, *last_hour, table="gpu_process_samples")
        == kept_processes + 2 * 20 * 60 // TICK_S
    )  # the processes' rows too, none dropped
    # What was sampled after the step is all there: it was written minutes ago.
    since_back = (clocks.wall - 30 * MIN, clocks.wall)
    written_since = samples_between(conn, *since_back)

    clocks.wall += DAY  # stepped forward a day
    run_for(clocks, sampler, writer, 10)
    after_forward = rollups(conn)
    assert after_back <= after_forward
    assert all(row[3] <= per_period for row in after_forward if row[0].endswith("_15m"))
    # The half hour sampled before the forward step is 10-40 minutes old by the monotonic
    # clock: younger than the 1 h window, so all of it is kept (a day by the wall clock).
    assert samples_between(conn, *since_back) == written_since
    # ... and once an hour has really passed, retention takes it as usual.
    run_for(clocks, sampler, writer, 60)
    assert samples_between(conn, *since_back) == 0
    assert samples_between(conn, clocks.wall - 50 * MIN, clocks.wall) == 2 * 50 * 60 // TICK_S


@pytest.mark.parametrize("step_ms", [-H, DAY], ids=["back 1 h", "forward 1 day"])
def test_the_tuis_last_five_minutes_recover_within_one_interval(daemon, step_ms):
    clocks, sampler, writer, _ = daemon
    source = StoreSource(str(writer.path), clock=clocks.wall_ms)
    run_for(clocks, sampler, writer, 10)
    assert source.fetch(View("overview")).gpus[0].util_history[-2] is not None  # the newest full slot

    clocks.wall += step_ms
    sampler.tick()  # one interval after the step
    writer.flush()
    clocks.advance(1)
    snap = source.fetch(View("overview"))
    assert snap.data_ms == clocks.wall - S  # the newest sample is the one written after the step
    newest = (
        sqlite3.connect(writer.path)
        .execute("SELECT gpu_util_pct FROM gpu_samples WHERE gpu_index = 0 AND ts_ms = ?", (snap.data_ms,))
        .fetchone()[0]
    )
    assert snap.gpus[0].util_pct == newest
    # The sparkline's newest slot holds it; the processes are those of the newest tick.
    assert snap.gpus[0].util_history[-1] is not None
    assert snap.processes and all(p.gpu_index in (0, 1) for p in snap.processes)


def test_metrics_show_the_samples_written_since_a_step_back(tmp_path):
    from test_metrics import fill_fleet, scrape_and_close

    ts = now_ms()
    conn = fill_fleet(tmp_path / "g.db", gpus=1, ts=ts)
    # Written in the hour before the wall clock stepped back, so stamped an hour ahead of now.
    insert_rows(conn, "gpu_samples", [dict(gpu_index=0, ts_ms=ts + H, gpu_util_pct=77)])
    insert_rows(conn, "host_samples", [dict(ts_ms=ts + H, cpu_pct=99.0)])
    got = scrape_and_close(tmp_path / "g.db", conn)
    assert [s.value for s in got["DCGM_FI_DEV_GPU_UTIL"]] == [5]  # fill_fleet's newest at ts
    assert [s.value for s in got["gpuwatch_host_last_sample_timestamp_seconds"]] == [ts / 1000]


def test_step_times_rates_and_run_durations_use_the_monotonic_clock(monkeypatch):
    """A real tracked run (embedded store) while the wall clock steps back and forward."""
    wall = [START]
    monkeypatch.setattr(clock, "wall_clock_ns", lambda: wall[0] * 1_000_000)
    with gpuwatch.track(name="stepped", config={"lr": 1e-3}) as run:
        for step in range(6):
            if step == 2:
                wall[0] -= H
            if step == 4:
                wall[0] += DAY
            time.sleep(0.01)  # a step's work: at least 10 ms, so at most 100,000 tokens/s
            run.step(tokens=1000)
            wall[0] += 10  # the wall clock runs on between steps
    conn = sqlite3.connect(paths.default_db_path(system=False))
    steps = conn.execute("SELECT ts_ms, step_time_ms, tokens_per_s FROM steps ORDER BY step").fetchall()
    assert len(steps) == 6
    # Step times and tokens/s come from the monotonic clock: each step took well under a second.
    assert all(10 <= ms < 10_000 and 100 < tps <= 100_000 for _, ms, tps in steps), steps
    # Times users read follow the wall clock, steps included.
    assert steps[2][0] < steps[1][0] - H / 2 and steps[4][0] > steps[3][0] + DAY / 2
    started, ended = conn.execute("SELECT started_ms, ended_ms FROM runs").fetchone()
    assert 0 <= ended - started < 60_000  # how long it really ran, not -1 h or +1 day
    assert 100 < queries.runs(conn)[0].tokens_per_s_avg <= 100_000

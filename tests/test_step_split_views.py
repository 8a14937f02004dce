"""The Run screen and `show` read what the zero-code hooks record per step: each optimiser's loss
by name (steps.losses_json) and where each step's time went (data, compute, eval/checkpoint,
other). Steps recorded through Run.step(losses=, split=), as the hooks do."""

from __future__ import annotations

import json
import sqlite3

from click.testing import CliRunner
from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

import gpuwatch
from gpuwatch.base import paths


def _gan_like_run() -> str:
    with gpuwatch.track(name="gan-like") as run:
        for n in range(4):
            run.step(
                loss=1.0 + n,
                losses={"netD": 1.0 + n, "netG": 0.5 - n / 10},
                split={
                    "data_wait_pct": 10.0,
                    "compute_pct": 70.0,
                    "eval_pct": 5.0 * (n % 2),
                    "closure_evals": 3,
                },
            )
    return run.run_id


def test_step_carries_the_named_losses_and_the_split_into_the_store():
    run_id = _gan_like_run()
    conn = sqlite3.connect(paths.default_db_path(system=False))
    rows = conn.execute(
        "SELECT losses_json, data_wait_pct, compute_pct, eval_pct, closure_evals FROM steps "
        "WHERE run_id = ? ORDER BY step",
        (run_id,),
    ).fetchall()
    conn.close()
    assert [json.loads(r[0]) for r in rows] == [{"netD": 1.0 + n, "netG": 0.5 - n / 10} for n in range(4)]
    assert [r[1:] for r in rows] == [(10.0, 70.0, 5.0 * (n % 2), 3) for n in range(4)]


def test_show_prints_each_optimisers_loss_and_the_split():
    from gpuwatch.cli import main

    run_id = _gan_like_run()
    out = CliRunner().invoke(main, ["show", run_id, "--db", str(paths.default_db_path(system=False))])
    assert out.exit_code == 0, out.output
    losses = next(x for x in out.output.splitlines() if x.strip().startswith("losses"))
    assert "netD final 4 (best 1)" in losses and "netG final 0.2 (best 0.2)" in losses
    split = next(x for x in out.output.splitlines() if x.strip().startswith("split"))
    assert (
        "data 10%" in split
        and "compute 70%" in split
        and "eval/checkpoint 2%" in split
        and "other 18%" in split
    )


@pilot_test
async def test_the_run_screen_charts_each_optimisers_loss_and_the_step_split():
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.screens.run import RunScreen
    from gpuwatch.tui.source import StoreSource

    run_id = _gan_like_run()
    app = GpuwatchApp(StoreSource(str(paths.default_db_path(system=False))), refresh_s=0.05)
    async with app.run_test(size=(80, 80)) as pilot:
        await app.push_screen(RunScreen(run_id))
        await pilot.pause(0.3)
        charts = {c.chart.title: c.chart for c in app.screen.query("ChartView")}
        assert [s.label for s in charts["loss"].series] == ["netD", "netG"]
        assert [v for _, v in charts["loss"].series[0].points] == [1.0, 2.0, 3.0, 4.0]
        split = charts["where each step went (share)"]
        assert [s.label for s in split.series] == ["data", "compute", "eval/checkpoint", "other"]
        assert [v for _, v in split.series[3].points] == [20.0, 15.0, 20.0, 15.0]


def test_compare_shows_each_optimisers_final_loss():
    from gpuwatch.cli import main

    first, second = _gan_like_run(), _gan_like_run()
    out = CliRunner().invoke(
        main, ["compare", first, second, "--db", str(paths.default_db_path(system=False))]
    )
    assert out.exit_code == 0, out.output
    rows = {line.split("  ")[0].strip(): line for line in out.output.splitlines() if "final loss net" in line}
    assert set(rows) == {"final loss netD", "final loss netG"} and "4" in rows["final loss netD"]

"""`gpuwatch capacity`: fit, predict, OOM bounds, storage, and a real CPU workload checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatch.analysis import capacity
from gpuwatch.cli import main
from gpuwatch.store import open_ro

ROOT = Path(__file__).parents[1]

# A stand-in workload (simulated memory): peak = 100 MB + 20 kB*L*B + 3*L^2*B bytes, and
# "out of memory" above 1.7 GB, reported on the same GPUWATCH_RESULT line as the real ones.
SIMULATED = """
import argparse, json
p = argparse.ArgumentParser(); p.add_argument("--device"); p.add_argument("--seq-len", type=int)
p.add_argument("--batch", type=int); p.add_argument("--steps", type=int)
a = p.parse_args()
peak = 100_000_000 + 20_000 * a.seq_len * a.batch + 3 * a.seq_len ** 2 * a.batch
print("GPUWATCH_RESULT " + json.dumps({"oom": peak > 1_700_000_000, "peak_bytes": min(peak, 1_700_000_000)}))
"""


def simulated_peak(seq_len: int, batch: int) -> int:
    return 100_000_000 + 20_000 * seq_len * batch + 3 * seq_len**2 * batch


def test_the_fit_recovers_a_quadratic_and_inverts_it():
    points = [(L, 5e8 + 1e4 * L + 2.5 * L * L) for L in (128, 256, 512, 1024)]
    fit = capacity.fit_quadratic(points)
    assert fit.a == pytest.approx(5e8, rel=1e-6)
    assert fit.b == pytest.approx(1e4, rel=1e-6)
    assert fit.c == pytest.approx(2.5, rel=1e-6)
    best = fit.max_len(2e9)
    assert fit.peak(best) <= 2e9 < fit.peak(best + 1)


def test_a_parabola_bending_down_is_noise_and_a_line_is_fitted_instead():
    fit = capacity.fit_quadratic([(100, 1000.0), (200, 1900.0), (300, 2700.0)])
    assert fit.c == 0 and fit.b > 0


def test_sizes_and_lists_are_parsed_or_refused_in_one_line():
    assert capacity.parse_size("8GiB") == 8 << 30
    assert capacity.parse_size("512M") == 512 << 20
    with pytest.raises(ValueError, match="is not a size"):
        capacity.parse_size("eight gigs")
    assert capacity.parse_ints("512,128,256") == [128, 256, 512]
    result = CliRunner().invoke(main, ["capacity", "--limit", "lots", "--", sys.executable, "-c", "0"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: 'lots' is not a size like 8GiB, 512MiB or 1000000"


def _study(tmp_path, *args) -> tuple:
    db = tmp_path / "gw.db"
    script = tmp_path / "simulated.py"
    script.write_text(SIMULATED)
    result = CliRunner().invoke(
        main,
        [
            "capacity",
            *args,
            "--margin",
            "0",
            "--db",
            str(db),
            "--",
            sys.executable,
            str(script),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    conn = open_ro(db)
    try:
        study_id, limit, fit_json, predicted_json = conn.execute(
            "SELECT id, limit_bytes, fit_json, predicted_json FROM capacity_studies ORDER BY id DESC LIMIT 1"
        ).fetchone()
        points = conn.execute(
            "SELECT batch, seq_len, ok, kind FROM capacity_points WHERE study_id = ?", (study_id,)
        ).fetchall()
    finally:
        conn.close()
    return result.output, limit, json.loads(fit_json), json.loads(predicted_json), points


def test_the_prediction_inverts_the_fit_at_the_budget_and_is_checked(tmp_path):
    output, limit, fits, predicted, points = _study(
        tmp_path, "--batch", "1,2", "--lengths", "1000,2000,4000", "--limit", "1600MiB"
    )
    assert limit == 1600 << 20 and set(fits) == {"1", "2"}
    for batch in (1, 2):
        best = predicted[str(batch)]["max_seq_len"]
        assert simulated_peak(best, batch) <= 1600 << 20 < simulated_peak(best + 8, batch)
        assert predicted[str(batch)]["verified_peak_bytes"] == simulated_peak(best, batch)
        assert (batch, best, 1, "verify") in points
        assert f"batch {batch}: max seq_len {best}" in output
    assert "+0.0%" in output  # measured beside predicted


def test_a_length_that_ran_out_of_memory_bounds_the_prediction(tmp_path):
    # The limit says 4 GiB but the (simulated) device runs out at 1.7 GB: batch 8 OOMs at 8000.
    output, _, _, predicted, points = _study(
        tmp_path, "--batch", "8", "--lengths", "1000,2000,4000,8000,16000", "--limit", "4GiB"
    )
    assert (8, 8000, 0, "measured") in points  # recorded, ok=0
    assert not [p for p in points if p[1] == 16000]  # longer lengths are not tried
    assert predicted["8"]["max_seq_len"] == 7992  # below the OOM, though the fit allows ~11500
    assert predicted["8"]["verified_ok"] is False
    assert "the check ran OUT OF MEMORY: use a larger --margin" in output


def test_a_command_without_a_result_line_is_named():
    result = CliRunner().invoke(
        main,
        [
            "capacity",
            "--lengths",
            "8,16",
            "--limit",
            "1GiB",
            "--",
            sys.executable,
            "-c",
            "print('hello')",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 1
    assert "batch 1 seq_len 8: no GPUWATCH_RESULT line in the workload's output" in result.output


@pytest.mark.slow(20)
def test_the_verified_peak_of_a_real_cpu_workload_is_within_15_percent_of_the_prediction(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("GPUWATCH_DB", str(tmp_path / "runs.db"))  # the workload's own runs
    study = capacity.run_study(
        [sys.executable, "-m", "workloads.gpt_train", "--tiny", "--attn", "naive", "--device", "cpu"],
        batches=[4],
        lengths=[256, 512, 768],
        margin=0.1,
        limit_bytes=900 << 20,
    )
    assert 4 in study.predicted, (study.points, study.notes)
    pred = study.predicted[4]
    assert pred["max_seq_len"] > 768  # extrapolated past what was measured
    assert pred["verified_ok"], (pred, study.points)
    error = abs(pred["verified_peak_bytes"] - pred["predicted_peak_bytes"]) / pred["predicted_peak_bytes"]
    assert error < 0.15, (pred, study.points)


def test_a_cpu_workloads_peak_is_its_own_not_its_launchers():
    """Linux carries a process's peak RSS across exec (ru_maxrss): a workload started by a big
    process (this test holds 1 GiB; a notebook, a test runner) must still report its own peak,
    or every point of a study reads the same and nothing fits."""
    held = bytearray(1 << 30)
    held[:: 1 << 12] = b"\1" * len(held[:: 1 << 12])  # touched: resident
    code = "import torch; from workloads import common; print(common.peak_bytes(torch.device('cpu')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    del held
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 700 << 20  # torch imported: a few hundred MiB, not the launcher's GiB

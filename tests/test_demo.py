"""`gpuwatch demo` through the real entry point: a training run and a generation run land in the DB."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

GPUWATCH = str(Path(sys.executable).parent / "gpuwatch")


def gpuwatch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GPUWATCH, *args], env=dict(os.environ), capture_output=True, text=True, timeout=240
    )


@pytest.mark.slow(15)
def test_demo_records_a_training_and_a_generation_run(tmp_path):
    db = tmp_path / "demo.db"
    done = gpuwatch("demo", "--no-tui", "--db", str(db))
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "[1/3] training" in out and "[2/3] generation" in out and "[3/3] OOM" in out
    assert "tokens/s" in out and "TTFT" in out  # each workload's own summary is passed on
    # Each stage's gpuwatch says the same of a host without NVIDIA's library: the demo says it once.
    ours = [line.strip() for line in out.splitlines() if line.strip().startswith("warning: gpuwatch:")]
    assert len(ours) == len(set(ours)), ours

    conn = sqlite3.connect(db)
    runs = dict(conn.execute("SELECT name, run_id FROM runs WHERE status = 'finished'").fetchall())
    assert set(runs) == {"demo-train", "demo-decode"}
    steps = conn.execute(
        "SELECT count(*), min(tokens_per_s) FROM steps WHERE run_id = ?", (runs["demo-train"],)
    ).fetchone()
    assert steps[0] == 30 and steps[1] > 0
    # The demo's model learns: the stored loss of its last steps is well below its first steps'.
    losses = [
        loss
        for (loss,) in conn.execute(
            "SELECT loss FROM steps WHERE run_id = ? ORDER BY step", (runs["demo-train"],)
        )
    ]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.7 * first, losses
    assert "loss " in out and " -> " in out  # and the summary says so
    gens = conn.execute(
        "SELECT count(*), min(ttft_ms) FROM generations WHERE run_id = ?", (runs["demo-decode"],)
    ).fetchone()
    assert gens[0] == 3 and gens[1] > 0
    # The OOM stage failed for real and left its postmortem (with the allocator's own message).
    kind, requested = conn.execute(
        "SELECT o.kind, o.requested_bytes FROM runs r JOIN oom_postmortems o USING (run_id) "
        "WHERE r.name = 'demo-oom' AND r.status = 'oom'"
    ).fetchone()
    assert requested > 0 and kind in ("gpu", "host")
    assert f"gpuwatch oom --db {db} demo-oom" in out
    conn.close()

    # The runs table (gpuwatch runs' rendering) lists both, and says where to look next.
    table = out[out.index("runs recorded in") :]
    assert str(db) in table and "demo-train" in table and "demo-decode" in table
    assert f"gpuwatch show --db {db}" in out
    # --db means that file only: the per-user default database was never created.
    assert not (Path(os.environ["XDG_DATA_HOME"]) / "gpuwatch" / "gpuwatch.db").exists()


def test_demo_db_must_be_a_file_path(tmp_path):
    done = gpuwatch("demo", "--db", str(tmp_path))
    assert done.returncode == 2
    assert "is a directory" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_demo_stops_at_a_failed_stage_with_one_line(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    done = gpuwatch("demo", "--no-tui", "--db", str(tmp_path / "a-file" / "demo.db"))
    assert done.returncode == 1
    assert "[1/" in done.stdout and "[2/" not in done.stdout  # nothing after the stage that failed
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert "demo stage 'training" in error and "demo.db" in error


@pytest.mark.gpu
def test_on_a_gpu_the_demo_oom_is_a_cuda_oom(tmp_path):
    db = tmp_path / "demo.db"
    done = gpuwatch("demo", "--no-tui", "--db", str(db))
    assert done.returncode == 0, done.stderr[-3000:]
    conn = sqlite3.connect(db)
    (kind,) = conn.execute(
        "SELECT o.kind FROM runs r JOIN oom_postmortems o USING (run_id) WHERE r.name = 'demo-oom'"
    ).fetchone()
    conn.close()
    assert kind == "gpu"

"""compare / export / report over a real database holding two known runs."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatch.cli import main
from gpuwatch.store import insert_rows, open_ro, open_rw

GIB = 1024**3
T0 = 1_700_000_000_000
EVIL = '<script>alert("x")</script>'


def fill_two_runs(path: Path) -> None:
    """Run A 'baseline' (finished, GPU 0 via CUDA_VISIBLE_DEVICES) for 100 s, 10 steps;
    run B (OOM, GPU 1 found through its process) for 60 s, 5 steps, with an evil name."""
    conn = open_rw(path)
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "gpus",
        [
            dict(
                gpu_index=i,
                uuid=f"GPU-{i:04d}",
                name="NVIDIA H100",
                first_seen_ms=T0 - 60_000,
                last_seen_ms=T0 + 400_000,
            )
            for i in range(2)
        ],
    )
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id="aaaa1111",
                name="baseline",
                uid=1000,
                user="alice",
                status="finished",
                started_ms=T0,
                ended_ms=T0 + 100_000,
                gpu_uuids="GPU-0000",
                command="python train.py",
                config_json=json.dumps({"lr": 3e-4, "note": EVIL}),
            ),
            dict(
                run_id="bbbb2222",
                name=EVIL,
                uid=1000,
                user="alice",
                status="oom",
                pid=4242,
                started_ms=T0 + 200_000,
                ended_ms=T0 + 260_000,
            ),
        ],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(
                run_id="aaaa1111",
                step=s,
                ts_ms=T0 + 10_000 * (s + 1),
                tokens=1000,
                tokens_per_s=1000.0 + 100 * s,
                step_time_ms=100.0 + s,
                mfu=0.4,
                mem_allocated_bytes=GIB,
                mem_reserved_bytes=2 * GIB,
                mem_peak_bytes=(s + 1) * GIB,
            )
            for s in range(10)
        ],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(
                run_id="bbbb2222",
                step=s,
                ts_ms=T0 + 200_000 + 10_000 * (s + 1),
                tokens=1000,
                tokens_per_s=2000.0,
                step_time_ms=50.0,
                mfu=0.5,
                mem_peak_bytes=20 * GIB,
            )
            for s in range(5)
        ],
    )
    # GPU 0 busy (80 %) only during A; idle samples outside the window must not count.
    samples = [
        dict(gpu_index=0, ts_ms=T0 + k * 1000, gpu_util_pct=80, power_mw=300_000, mem_used_bytes=GIB)
        for k in range(0, 101)
    ]
    samples += [dict(gpu_index=0, ts_ms=T0 - k * 1000, gpu_util_pct=0, power_mw=60_000) for k in range(1, 30)]
    samples += [
        dict(gpu_index=1, ts_ms=T0 + 200_000 + k * 1000, gpu_util_pct=40, power_mw=200_000)
        for k in range(0, 61)
    ]
    insert_rows(conn, "gpu_samples", samples)
    insert_rows(
        conn,
        "processes",
        [
            dict(
                pid=4242,
                start_ms=T0 + 199_000,
                uid=1000,
                user="alice",
                run_id="bbbb2222",
                first_seen_ms=T0 + 200_000,
                last_seen_ms=T0 + 260_000,
            )
        ],
    )
    insert_rows(
        conn,
        "gpu_process_samples",
        [dict(gpu_index=1, pid=4242, ts_ms=T0 + 210_000, used_mem_bytes=20 * GIB)],
    )
    insert_rows(
        conn,
        "run_events",
        [
            dict(run_id="aaaa1111", seq=1, ts_ms=T0, kind="start"),
            dict(run_id="aaaa1111", seq=2, ts_ms=T0 + 100_000, kind="end"),
        ],
    )
    insert_rows(
        conn,
        "oom_postmortems",
        [
            dict(
                run_id="bbbb2222",
                ts_ms=T0 + 255_000,
                kind="gpu",
                device=1,
                requested_bytes=4 * GIB,
                total_bytes=80 * GIB,
                free_bytes=GIB,
                allocated_bytes=70 * GIB,
                reserved_bytes=75 * GIB,
                seq_len=32768,
                batch=8,
                phase="backward",
                error_message="CUDA out of memory. " + EVIL,
                advice_json=json.dumps([{"title": "Halve the batch", "detail": "batch 8 -> 4 fits " + EVIL}]),
                neighbours_json=json.dumps(
                    [{"pid": 777, "user": "bob", "used_mem_bytes": 5 * GIB, "run_id": None}]
                ),
            )
        ],
    )
    conn.execute("COMMIT")
    conn.close()


@pytest.fixture
def db(tmp_path) -> Path:
    path = tmp_path / "runs.db"
    fill_two_runs(path)
    return path


def gw(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def test_compare_figures(db):
    from gpuwatch.analysis.compare import compare

    conn = open_ro(db)
    a, b = compare(conn, ["baseline", "bbbb"])
    conn.close()
    assert (a.tokens_per_s.mean, a.tokens_per_s.p50) == (1450.0, 1450.0)
    assert a.tokens_per_s.p90 == pytest.approx(1810.0)  # linear between 1800 and 1900
    assert (a.step_time_ms.mean, a.step_time_ms.p90) == (104.5, pytest.approx(108.1))
    assert a.peak_mem_bytes == 10 * GIB and a.mfu_mean == pytest.approx(0.4)
    assert a.gpus == (0,) and a.gpu_util_pct == 80  # idle samples before the run are not counted
    assert a.duration_ms == 100_000 and a.steps == 10 and a.status == "finished"
    assert b.gpus == (1,) and b.gpu_util_pct == 40 and b.status == "oom"
    assert b.tokens_per_s.p50 == 2000.0 and b.peak_mem_bytes == 20 * GIB


def test_compare_peak_memory_of_a_cpu_run_is_its_rss(tmp_path):
    from gpuwatch.analysis.compare import compare

    conn = open_rw(tmp_path / "cpu.db")
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "runs",
        [dict(run_id="cpu1", name="cpu", uid=1, status="finished", started_ms=T0, ended_ms=T0 + 5_000)],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(run_id="cpu1", step=s, ts_ms=T0 + 1000 * s, tokens=10, rss_bytes=(s + 1) * GIB)
            for s in range(3)
        ],
    )
    conn.execute("COMMIT")
    (run,) = compare(conn, ["cpu1"])
    conn.close()
    assert run.peak_mem_bytes == 3 * GIB


def test_compare_cli_marks_changes_against_first_run(db):
    out = gw("compare", "aaaa1111", "bbbb2222", "--db", db, "--no-color")
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert "+38 %" in lines["tokens/s mean"]  # 2000 vs 1450
    assert "-52 %" in lines["step time mean"]  # 50 vs 104.5
    assert "+100 %" in lines["peak memory"]
    assert "-50 %" in lines["GPU util"]
    assert "finished" in lines["end state"] and "oom" in lines["end state"]
    assert "\x1b[" not in out
    coloured = gw("compare", "aaaa1111", "bbbb2222", "--db", db, "--color")
    tps = next(line for line in coloured.splitlines() if line.startswith("tokens/s mean"))
    peak = next(line for line in coloured.splitlines() if line.startswith("peak memory"))
    assert "\x1b[32m" in tps and "\x1b[31m" in peak  # faster is green, more memory is red


def test_compare_json_and_unknown_run(db):
    data = json.loads(gw("compare", "baseline", "--json", "--db", db))
    assert data[0]["run_id"] == "aaaa1111" and data[0]["tokens_per_s"]["p50"] == 1450.0
    result = CliRunner().invoke(main, ["compare", "baseline", "nope", "--db", str(db)])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: no run matches 'nope'"


@pytest.fixture
def sweep_db(db) -> Path:
    """The two runs as a sweep: lr 3e-4 vs 3e-3, another commit and command; A 10 steps with
    loss 5.0 - 0.3 s, B 5 steps with loss 4.0 - 0.2 s, 1000 tokens a step."""
    conn = open_rw(db)
    conn.execute(
        "UPDATE runs SET config_json = ?, git_commit = 'aaaaaaa' WHERE run_id = 'aaaa1111'",
        (json.dumps({"lr": 3e-4, "model": {"layers": 12}}),),
    )
    conn.execute(
        "UPDATE runs SET config_json = ?, git_commit = 'bbbbbbb', command = 'python train.py --lr 3e-3' "
        "WHERE run_id = 'bbbb2222'",
        (json.dumps({"lr": 3e-3, "model": {"layers": 12}}),),
    )
    conn.execute("UPDATE steps SET loss = 5.0 - 0.3 * step WHERE run_id = 'aaaa1111'")
    conn.execute("UPDATE steps SET loss = 4.0 - 0.2 * step WHERE run_id = 'bbbb2222'")
    conn.commit()
    conn.close()
    return db


def test_compare_says_what_differed_and_the_loss_at_equal_tokens(sweep_db):
    out = gw("compare", "aaaa1111", "bbbb2222", "--db", sweep_db, "--no-color")
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines() if "  " in line}
    assert rows["lr"][1:] == ["0.0003", "0.003"]
    assert rows["git commit"][2:] == ["aaaaaaa", "bbbbbbb"]
    assert "python train.py --lr 3e-3" in " ".join(rows["command"])
    assert "model.layers" not in rows  # the same in both runs: not a difference
    assert rows["final loss"][2:4] == ["2.3", "3.2"] and rows["best loss"][2:4] == ["2.3", "3.2"]
    # B saw 5000 tokens: both runs at 5000 tokens (step 4): A 5.0 - 1.2, B 4.0 - 0.8.
    assert rows["loss at 5k tokens"][4:6] == ["3.8", "3.2"]
    chart = out[out.index("loss vs tokens") :].splitlines()
    assert "baseline" in chart[0] and any(ch in "".join(chart[1:]) for ch in "⡀⠉⠒")
    assert chart[-1].strip().endswith("10k tokens") and len(chart) <= 12

    data = json.loads(gw("compare", "aaaa1111", "bbbb2222", "--json", "--db", sweep_db))
    assert [d["loss_at_equal"] for d in data] == [pytest.approx(3.8), pytest.approx(3.2)]
    assert data[1]["differs"]["lr"] == "0.003" and data[0]["equal_at"] == 5000


def test_report_and_show_carry_the_loss(sweep_db, tmp_path):
    out = tmp_path / "r.html"
    gw("report", "baseline", "-o", out, "--db", sweep_db)
    html = out.read_text()
    assert "Loss vs tokens" in html and "<td>final loss</td><td>2.3</td>" in html
    shown = gw("show", "baseline", "--db", sweep_db)
    assert "final 2.3   best 2.3" in shown and "loss vs tokens" in shown


def test_export_json_holds_the_runs_data(db, tmp_path):
    out = tmp_path / "a.json"
    gw("export", "baseline", "--format", "json", "-o", out, "--db", db)
    doc = json.loads(out.read_text())
    assert doc["run"]["run_id"] == "aaaa1111"
    assert [s["step"] for s in doc["steps"]] == list(range(10))
    assert len(doc["gpu_samples"]) == 101  # GPU 0 inside [start, end] only
    assert {s["gpu_index"] for s in doc["gpu_samples"]} == {0}
    assert [e["kind"] for e in doc["run_events"]] == ["start", "end"]


def test_export_csv_one_file_per_table(db, tmp_path):
    gw("export", "bbbb2222", "--format", "csv", "-o", tmp_path / "out", "--db", db)
    with open(tmp_path / "out" / "steps.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 5 and float(rows[0]["tokens_per_s"]) == 2000.0
    with open(tmp_path / "out" / "gpu_samples.csv") as f:
        samples = list(csv.DictReader(f))
    assert len(samples) == 61 and {s["gpu_index"] for s in samples} == {"1"}
    with open(tmp_path / "out" / "run_events.csv") as f:
        assert "seq" in f.readline()  # a header even with no rows


def test_export_sqlite_is_one_file_with_the_run_alone_that_show_and_any_sqlite_tool_open(db, tmp_path):
    import sqlite3

    out = tmp_path / "colleague" / "b.db"
    out.parent.mkdir()
    gw("note", "bbbb2222", "batch 8 was too much", "--db", db)
    conn = open_rw(db)
    insert_rows(conn, "profiles", [dict(id=7, run_id="bbbb2222", ts_ms=T0 + 210_000, trigger="on_demand")])
    insert_rows(conn, "profile_ops", [dict(profile_id=7, name="aten::mm", calls=3, self_cpu_us=5.0)])
    insert_rows(
        conn,
        "profile_breakdowns",
        [
            dict(
                profile_id=7,
                gpu=1,
                idle_pct=37.5,
                breakdown_json='{"temporal": {"idle_pct": 37.5, '
                '"compute_pct": 60.0, "non_compute_pct": 2.5}}',
            )
        ],
    )
    conn.execute("UPDATE gpu_samples SET energy_mj = (ts_ms - ?) * 200 WHERE gpu_index = 1", (T0,))  # 200 W
    conn.close()
    gw("export", "bbbb2222", "--format", "sqlite", out, "--db", db)
    assert sorted(p.name for p in out.parent.iterdir()) == ["b.db"]  # no -wal/-shm beside it
    plain = sqlite3.connect(out)  # any SQLite tool
    counts = {
        t: plain.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        for t in (
            "runs",
            "steps",
            "gpu_samples",
            "oom_postmortems",
            "profiles",
            "profile_ops",
            "profile_breakdowns",
            "run_notes",
            "gpus",
        )
    }
    assert counts == {
        "runs": 1,
        "steps": 5,
        "gpu_samples": 61,
        "oom_postmortems": 1,
        "profiles": 1,
        "profile_ops": 1,
        "profile_breakdowns": 1,
        "run_notes": 1,
        "gpus": 1,
    }
    assert plain.execute("SELECT DISTINCT gpu_index FROM gpu_samples").fetchall() == [(1,)]
    plain.close()
    shown = gw("show", "bbbb2222", "--db", out)
    energy = [line for line in gw("show", "bbbb2222", "--db", db).splitlines() if "energy" in line]
    assert energy and energy == [line for line in shown.splitlines() if "energy" in line]
    assert "[oom]" in shown and "batch 8 was too much" in shown and "steps     5" in shown
    assert "profile   GPU idle 38% · compute 60%" in shown  # the breakdown came along
    assert "bbbb2222" in gw("runs", "--search", "batch", "--db", out)
    result = CliRunner().invoke(main, ["export", "bbbb2222", "--format", "sqlite", str(out), "--db", str(db)])
    assert result.exit_code == 1 and "exists" in result.output  # never overwritten


def test_export_parquet_without_pyarrow_says_how_to_get_it(db, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if pyarrow were not installed
    result = CliRunner().invoke(
        main, ["export", "baseline", "--format", "parquet", "-o", str(tmp_path / "p"), "--db", str(db)]
    )
    assert result.exit_code == 1
    assert result.output.strip() == "Error: parquet export needs pyarrow: pip install pyarrow"
    assert not (tmp_path / "p").exists()


def test_export_parquet_round_trip(db, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    gw("export", "baseline", "--format", "parquet", "-o", tmp_path / "p", "--db", db)
    assert pq.read_table(tmp_path / "p" / "steps.parquet").num_rows == 10


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[str] = []
        self.scripts = 0
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.scripts += tag == "script"

    def handle_data(self, data):
        self.text.append(data)


def test_report_is_self_contained_html_with_charts_and_postmortem(db, tmp_path):
    out = tmp_path / "r.html"
    gw("report", "bbbb2222", "-o", out, "--db", db)
    html = out.read_text()
    parser = _Collect()
    parser.feed(html)
    assert parser.tags.count("svg") == 4  # tokens/s, memory, GPU utilisation, power (no loss recorded)
    assert parser.tags.count("polyline") >= 4
    assert parser.scripts == 0  # the evil run name, error and advice are escaped, not run
    text = "".join(parser.text)
    assert EVIL in text  # shown to the reader as text
    assert "Out of memory on GPU 1" in text and "Halve the batch" in text
    assert "4.0 GiB" in text and "bob" in text  # requested bytes; neighbour on that GPU
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched
    assert "<script" not in html and "src=" not in html


def test_report_shows_config_and_no_data_charts(db, tmp_path):
    out = tmp_path / "a.html"
    gw("report", "baseline", "-o", out, "--db", db)
    parser = _Collect()
    parser.feed(out.read_text())
    text = "".join(parser.text)
    assert '"lr": 0.0003' in text and "<script>alert(" in text and parser.scripts == 0
    assert "OOM postmortem" not in text
    assert "no data recorded" not in text


def test_real_entry_point_compare(db):
    exe = Path(sys.executable).with_name("gpuwatch")
    proc = subprocess.run(
        [str(exe), "compare", "baseline", "bbbb2222", "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s p90" in proc.stdout and "\x1b[" not in proc.stdout  # not a tty: no colour

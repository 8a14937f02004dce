"""Trace analysis behaviour a user sees: the cause named, advice given, bad files refused."""

from __future__ import annotations

import gzip

import pytest
from trace_gen import make_trace, write_trace

from gpuwatch.analysis.trace import TraceError, analyse_files
from gpuwatch.analysis.trace.reader import iter_trace


def _one(tmp_path, name="t.json", **kw) -> dict:
    return analyse_files([write_trace(tmp_path / name, make_trace(**kw))])


def test_data_loader_bound_run_is_named_and_advised(tmp_path):
    res = _one(tmp_path, loader_us=20_000.0)
    idle = res["ranks"][0]["idle"]
    assert idle["dataloader_pct"] > 80
    assert any("data loader" in a and "num_workers" in a for a in res["advice"])


def test_launch_bound_run_is_host_wait(tmp_path):
    res = _one(tmp_path, cpu_gap_us=400.0, loader_us=10.0, sync=False)
    r = res["ranks"][0]
    assert r["temporal"]["idle_pct"] > 30
    assert r["idle"]["host_wait_pct"] > 80
    assert any("launch-bound" in a for a in res["advice"])


def test_math_attention_and_pageable_copies_are_advised(tmp_path):
    res = _one(tmp_path, attention="math", htod_us=3000.0)
    groups = {g["group"] for g in res["ranks"][0]["kernel_groups"]}
    assert {"attention (math)", "memcpy", "gemm", "memset"} <= groups
    assert any(a.startswith("attention runs the math kernel") for a in res["advice"])
    assert any(a.startswith("HtoD copies") for a in res["advice"])
    flash = _one(tmp_path, name="f.json", attention="flash")
    assert "attention (flash/SDPA)" in {g["group"] for g in flash["ranks"][0]["kernel_groups"]}
    assert not any("math kernel" in a for a in flash["advice"])


def test_straggler_rank_is_named(tmp_path):
    paths = [
        write_trace(tmp_path / f"r{r}.json", make_trace(rank=r, world=3, slow=1.5 if r == 2 else 1.0))
        for r in range(3)
    ]
    res = analyse_files(paths)
    assert res["slowest"]["rank"] == 2 and res["slowest"]["slower_pct"] > 30
    assert any(a.startswith("rank 2 computes") for a in res["advice"])
    assert all(r["overlap_pct"] is not None for r in res["ranks"])


def test_rank_from_distributed_info_else_file_order(tmp_path):
    a = write_trace(tmp_path / "a.json", make_trace(rank=1, world=2))
    b = write_trace(tmp_path / "b.json", make_trace(rank=0, world=2))
    assert [(r["rank"], r["file"]) for r in analyse_files([a, b])["ranks"]] == [(0, str(b)), (1, str(a))]
    c = write_trace(tmp_path / "c.json", make_trace(distributed_info=False))
    d = write_trace(tmp_path / "d.json", make_trace(distributed_info=False, seed=2))
    assert [r["file"] for r in analyse_files([c, d])["ranks"]] == [str(c), str(d)]


def test_gzip_and_plain_give_the_same_breakdown(tmp_path):
    trace = make_trace(seed=5)
    plain = analyse_files([write_trace(tmp_path / "t.json", trace)])["ranks"][0]
    packed = analyse_files([write_trace(tmp_path / "t.json.gz", trace)])["ranks"][0]
    for key in ("temporal", "idle", "kernels", "steps"):
        assert plain[key] == packed[key]


def test_per_step_figures_cover_every_step_with_gpu_work(tmp_path):
    r = _one(tmp_path, steps=5, loader_us=5000.0)["ranks"][0]
    assert [s["step"] for s in r["steps"]] == [0, 1, 2, 3, 4]
    assert r["steps_analysed"] == 4  # the last step is left out of the totals, as HTA does
    assert all(0 <= s["idle_pct"] <= 100 for s in r["steps"])
    # the GPU idles while the next batch loads: that wait is the later step's, not lost between
    later = r["steps"][1:]
    assert all(s["idle_pct"] > 10 and s["idle_dataloader_pct"] > 50 for s in later)
    busy = sum(s["kernel_time_us"] for s in r["steps"][:4])
    assert busy == pytest.approx(r["temporal"]["kernel_time_us"], rel=0.01)
    # each step's kernel groups add up to the run's
    for whole in r["kernel_groups"]:
        per_step = [
            g["total_us"] for s in r["steps"][:4] for g in s["kernel_groups"] if g["group"] == whole["group"]
        ]
        assert sum(per_step) == pytest.approx(whole["total_us"], rel=0.01), whole["group"]


def test_reader_streams_keys_in_any_order_and_split_across_chunks(tmp_path, monkeypatch):
    import gpuwatch.analysis.trace.reader as reader

    monkeypatch.setattr(reader, "_CHUNK", 7)  # every event straddles several reads
    path = tmp_path / "t.json"
    path.write_text(
        '{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, '
        '"dur": 10, "args": {"stream": 7, "correlation": 3}}], '
        '"distributedInfo": {"rank": 3}}'
    )
    items = list(iter_trace(path))
    assert [kind for kind, _ in items] == ["meta", "event", "meta"]
    assert items[1][1]["name"] == "k" and items[2][1] == ("distributedInfo", {"rank": 3})
    assert analyse_files([path])["ranks"][0]["rank"] == 3


@pytest.mark.parametrize(
    "content, says",
    [
        (b"not json", "not a JSON trace"),
        (b'{"traceEvents": [{"ph": "X"', "not a JSON trace"),
        (b'{"schemaVersion": 1}', "no traceEvents"),
    ],
)
def test_bad_files_are_one_clear_error(tmp_path, content, says):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(TraceError, match=says) as err:
        analyse_files([path])
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    gz = tmp_path / "bad.json.gz"
    gz.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(TraceError, match="not a JSON trace"):
        analyse_files([gz])
    with pytest.raises(TraceError, match="no such file"):
        analyse_files([tmp_path / "missing.json"])


def test_gzip_file_reads(tmp_path):
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as fh:
        fh.write('{"traceEvents": []}')
    r = analyse_files([path])["ranks"][0]
    assert r["gpu"] is False and r["kernels"] == []


def _gw(*args):
    import subprocess
    from pathlib import Path

    exe = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "gpuwatch"
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)


def test_trace_command_table_fits_80_columns_and_leads_with_the_bar(tmp_path):
    paths = [
        str(write_trace(tmp_path / f"r{r}.json.gz", make_trace(rank=r, world=2, loader_us=5000.0)))
        for r in range(2)
    ]
    out = _gw("trace", *paths)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("rank 0") and lines[2].startswith("[█")
    assert "data loader" in out.stdout and "advice:" in out.stdout
    assert "KERNEL" in out.stdout and "slowest rank" in out.stdout and "IDLE WAITS ON" in out.stdout


def test_trace_command_json_shape(tmp_path):
    import json

    path = write_trace(tmp_path / "t.json", make_trace(cpu_gap_us=300.0, sync=False))
    out = _gw("trace", str(path), "--format", "json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    r = res["ranks"][0]
    assert (r["rank"], r["file"]) == (0, str(path))
    assert set(r["temporal"]) >= {"idle_pct", "compute_pct", "non_compute_pct", "kernel_time_us"}
    assert r["idle"]["host_wait_pct"] > 50 and r["kernels"][0]["share_pct"] > 0
    assert "overlap_pct" in r and isinstance(res["advice"], list) and res["advice"]


def test_trace_command_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{]")
    out = _gw("trace", str(bad))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and "bad.json" in out.stderr

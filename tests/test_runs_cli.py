"""`gpuwatch runs` and `gpuwatch show` on a real SQLite file holding known runs; fmt helpers."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwatch.base import fmt
from gpuwatch.cli import main
from gpuwatch.store import insert_rows, now_ms, open_rw

GiB, MiB = 2**30, 2**20
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def _run(run_id, name, user, status, started, ended=None, **extra):
    return {
        "run_id": run_id,
        "name": name,
        "user": user,
        "uid": 1000 if user == "alice" else 1001,
        "status": status,
        "started_ms": started,
        "ended_ms": ended,
        "host": "node1",
        "pid": 4242,
        **extra,
    }


@pytest.fixture
def known_db(tmp_path):
    path = tmp_path / "known.db"
    now = now_ms()
    conn = open_rw(path)
    insert_rows(
        conn,
        "runs",
        [
            _run(
                "aaaa1111aaaa",
                "gpt-4k",
                "alice",
                "finished",
                now - 2 * HOUR,
                now - HOUR,
                config_json=json.dumps({"lr": 0.0003, "seq_len": 4096}),
                command="python train.py",
                exit_code=0,
                git_commit="0123456789abcdef",
                mode="daemon",
            ),
            _run(
                "bbbb2222bbbb",
                "probe",
                "bob",
                "oom",
                now - 30 * MIN,
                now - 29 * MIN,
                error_type="MemoryError",
                error_message="host out of memory",
            ),
            _run("cccc3333cccc", "old", "alice", "failed", now - 3 * DAY, now - 3 * DAY + MIN),
            _run("dddd4444dddd", "live", "bob", "running", now - 5 * MIN),
            _run(
                "eeee5555eeee",
                "ddp",
                "carol",
                "killed",
                now - 3 * DAY - HOUR,
                now - 3 * DAY,
                signal=int(signal.SIGTERM),
                job_id="torchrun-x",
                rank=0,
                local_rank=0,
                world_size=2,
            ),
            _run(
                "eeee6666eeee",
                "ddp",
                "carol",
                "killed",
                now - 3 * DAY - HOUR,
                now - 3 * DAY,
                signal=int(signal.SIGTERM),
                job_id="torchrun-x",
                rank=1,
                local_rank=1,
                world_size=2,
            ),
        ],
    )
    # gpt-4k: 1000 tokens per 100 ms step = 10k tokens/s, then 5k at the last step; 2 GiB peak.
    insert_rows(
        conn,
        "steps",
        [
            {
                "run_id": "aaaa1111aaaa",
                "step": i,
                "ts_ms": now - 2 * HOUR + i * 1000,
                "tokens": 1000,
                "step_time_ms": 100.0 if i < 4 else 200.0,
                "tokens_per_s": 10_000.0 if i < 4 else 5_000.0,
                "mem_peak_bytes": i * GiB // 2,
                "mem_reserved_bytes": 3 * GiB,
                "rss_bytes": 900 * MiB,
            }
            for i in range(1, 5)
        ],
    )
    insert_rows(
        conn,
        "steps",
        [{"run_id": "bbbb2222bbbb", "step": 1, "ts_ms": now - 30 * MIN, "rss_bytes": 512 * MiB}],
    )
    conn.close()
    return str(path)


@pytest.fixture(autouse=True)
def terminal(monkeypatch):
    """CliRunner's stdout is no terminal; these tests read the table a person sees."""
    monkeypatch.setattr("gpuwatch.cli.runs_cmd.on_terminal", lambda: True)


def cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def table_rows(output: str) -> dict[str, str]:
    return {line.split()[0]: line for line in output.splitlines()[1:]}


def test_runs_table_fits_80_columns_newest_first_with_figures(known_db):
    out = cli("runs", "--db", known_db)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split() == [
        "ID",
        "NAME",
        "USER",
        "STATUS",
        "START",
        "DUR",
        "TOK/S",
        "LAST",
        "PEAK",
        "MEM",
        "OOM",
    ]
    assert all(len(line) <= 80 for line in lines)
    assert [line.split()[0] for line in lines[1:]] == [
        "dddd4444",
        "bbbb2222",
        "aaaa1111",
        "cccc3333",
        "eeee5555",
        "eeee6666",
    ]
    rows = table_rows(out.output)
    # 4000 tokens over 0.5 s of steps = 8k/s average; last step 5k/s; peak 2 GiB; 1 h long.
    assert rows["aaaa1111"].split()[1:] == [
        "gpt-4k",
        "alice",
        "finished",
        rows["aaaa1111"].split()[4],
        "1h00m",
        "8k",
        "5k",
        "2.0",
        "GiB",
    ]
    assert rows["bbbb2222"].endswith("512.0 MiB OOM")
    assert "OOM" not in rows["aaaa1111"]


def test_runs_filters(known_db):
    def ids(*args):
        return list(table_rows(cli("runs", "--db", known_db, *args).output))

    assert ids("--status", "oom") == ["bbbb2222"]
    assert ids("--user", "alice") == ["aaaa1111", "cccc3333"]
    assert ids("--since", "2h") == ["dddd4444", "bbbb2222", "aaaa1111"]  # old runs ended before
    assert ids("--limit", "1") == ["dddd4444"]
    assert cli("runs", "--db", known_db, "--user", "nobody").output.strip() == "no runs match"


def test_runs_bad_input_is_one_clear_line(known_db, tmp_path):
    out = cli("runs", "--db", known_db, "--since", "yesterday-ish")
    assert out.exit_code == 2 and "--since" in out.output and "'yesterday-ish'" in out.output
    out = cli("runs", "--db", known_db, "--status", "exploded")
    assert out.exit_code == 2 and "exploded" in out.output
    out = cli("runs", "--db", str(tmp_path / "missing.db"))
    assert out.exit_code == 1 and out.output.startswith("Error: ") and "no such database" in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_show_summary_config_sparkline_memory_and_end(known_db):
    out = cli("show", "gpt-4k", "--db", known_db)
    assert out.exit_code == 0, out.output
    text = out.output
    assert text.splitlines()[0] == "run aaaa1111aaaa  gpt-4k  [finished]"
    assert "duration 1h00m" in text and "python train.py" in text and "git 0123456789ab" in text
    assert "steps     4   tokens/s avg 8k   last 5k" in text
    assert "tokens/s  ███▁  5k..10k" in text
    assert "GPU peak allocated 2.0 GiB   reserved 3.0 GiB   host RSS peak 900.0 MiB" in text
    assert "end       finished, exit code 0" in text
    assert "  lr       0.0003" in text and "  seq_len  4096" in text


def test_show_by_prefix_end_states_and_ranks(known_db):
    oom = cli("show", "bbbb", "--db", known_db).output
    assert "end       oom: MemoryError: host out of memory" in oom
    ddp = cli("show", "eeee5555", "--db", known_db).output
    assert "end       killed by SIGTERM" in ddp
    assert "rank      0/2 (local 0)   job torchrun-x" in ddp
    assert "ranks\n  eeee6666eeee  ddp  rank 1 (local 1)  killed  node1" in ddp
    running = cli("show", "live", "--db", known_db).output
    assert "end       running" in running and "steps     none recorded" in running


def test_show_unknown_and_ambiguous_runs(known_db):
    out = cli("show", "zzz", "--db", known_db)
    assert (out.exit_code, out.output.strip()) == (1, "Error: no run matches 'zzz'")
    out = cli("show", "eeee", "--db", known_db)
    assert out.exit_code == 1 and "matches 2 runs" in out.output


@pytest.mark.parametrize("command", ["run", "runs", "show"])
def test_commands_have_help(command):
    out = cli(command, "--help")
    assert out.exit_code == 0 and "Example:" in out.output


def test_fmt_helpers():
    assert [fmt.size(n) for n in (None, 0, 1023, 1536, 3 * GiB, 5 * 2**40)] == [
        "-",
        "0 B",
        "1023 B",
        "1.5 KiB",
        "3.0 GiB",
        "5.0 TiB",
    ]
    assert [fmt.duration(ms) for ms in (None, 850, 5300, 42_000, 192_000, 7_500_000, 3 * DAY + 4 * HOUR)] == [
        "-",
        "850ms",
        "5.3s",
        "42s",
        "3m12s",
        "2h05m",
        "3d04h",
    ]
    assert [fmt.count(x) for x in (None, 7, 12.5, 12_345, 2.5e9)] == ["-", "7", "12.5", "12.3k", "2.5G"]
    assert fmt.sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert fmt.sparkline([1, None, 3]) == "▁ █"
    assert fmt.sparkline([5, 5]) == "▄▄"
    assert fmt.sparkline(range(100), width=10) == "▁▂▃▃▄▅▆▆▇█"
    assert fmt.sparkline([0, 50, 100], lo=0, hi=200) == "▁▃▅"


GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))


def test_runs_as_csv_and_json_give_every_run_with_raw_values(known_db):
    as_json = json.loads(cli("runs", "--db", known_db, "--format", "json").output)
    as_csv = list(csv.DictReader(io.StringIO(cli("runs", "--db", known_db, "--format", "csv").output)))
    assert (
        [r["run_id"] for r in as_json]
        == [r["run_id"] for r in as_csv]
        == ["dddd4444dddd", "bbbb2222bbbb", "aaaa1111aaaa", "cccc3333cccc", "eeee5555eeee", "eeee6666eeee"]
    )
    gpt = next(r for r in as_json if r["name"] == "gpt-4k")
    assert gpt["tokens_per_s_avg"] == 8000.0 and gpt["peak_mem_bytes"] == 2 * GiB
    assert gpt["status"] == "finished" and gpt["user"] == "alice" and gpt["oom"] is False
    assert next(r for r in as_csv if r["name"] == "gpt-4k")["peak_mem_bytes"] == str(2 * GiB)
    assert next(r for r in as_json if r["name"] == "probe")["oom"] is True
    assert json.loads(cli("runs", "--db", known_db, "--user", "nobody", "--format", "json").output) == []


def _long_named_db(tmp_path) -> str:
    path = tmp_path / "long.db"
    conn = open_rw(path)
    insert_rows(
        conn,
        "runs",
        [_run("ffff7777ffff", "llama-70b-long-context-sweep-3", "alice", "running", now_ms() - MIN)],
    )
    conn.close()
    return str(path)


def test_runs_piped_to_a_script_cuts_no_name_or_id(tmp_path):
    out = subprocess.run(
        [GPUWATCH, "runs", "--db", _long_named_db(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    header, row = out.splitlines()
    assert row.split()[:4] == ["ffff7777ffff", "llama-70b-long-context-sweep-3", "alice", "running"]
    assert header.split()[:2] == ["ID", "NAME"] and "…" not in out


def test_runs_on_a_terminal_fits_it(tmp_path):
    """The real command on a pseudo-terminal: names are cut with … so lines fit 80 columns."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [GPUWATCH, "runs", "--db", _long_named_db(tmp_path)], stdout=follower, stderr=follower
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the command exited and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    lines = b"".join(chunks).decode().splitlines()
    assert lines[1].split()[:2] == ["ffff7777", "llama-70b-l…"]
    assert all(len(line) <= 80 for line in lines)

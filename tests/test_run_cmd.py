"""`gpuwatch run -- CMD`: the real CLI in a subprocess, embedded mode, real child processes."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from gpuwatch.base import paths
from gpuwatch.cli.run_cmd import default_name

PY = sys.executable
GPUWATCH = [str(Path(PY).with_name("gpuwatch"))]


def gw_run(*command: str, name: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    args = [*GPUWATCH, "run", *(["--name", name] if name else []), "--", *command]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout)


def runs() -> list[sqlite3.Row]:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    conn.row_factory = sqlite3.Row
    return conn.execute("SELECT * FROM runs ORDER BY started_ms").fetchall()


def steps(run_id: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(paths.default_db_path(system=False))
    return conn.execute("SELECT step, tokens FROM steps WHERE run_id = ? ORDER BY step", (run_id,)).fetchall()


def test_exit_code_command_and_duration_are_recorded():
    out = gw_run(PY, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)", name="exit3")
    assert out.returncode == 3, out.stderr
    (r,) = runs()
    assert (r["name"], r["status"], r["exit_code"], r["signal"]) == ("exit3", "failed", 3, None)
    assert r["command"].endswith("-c 'import sys, time; time.sleep(0.3); sys.exit(3)'")
    assert r["ended_ms"] - r["started_ms"] >= 300


def test_success_is_finished():
    assert gw_run("true").returncode == 0
    (r,) = runs()
    assert (r["name"], r["status"], r["exit_code"]) == ("true", "finished", 0)


def test_signal_death_is_killed_and_exit_status_follows_the_shell_convention():
    out = gw_run(PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert out.returncode == 128 + signal.SIGKILL
    (r,) = runs()
    assert (r["status"], r["signal"], r["exit_code"]) == ("killed", signal.SIGKILL, None)


def test_the_program_keeps_its_cpu_priority_and_every_thread_of_the_wrapper_steps_back():
    """On a saturated host the training must get the CPU before gpuwatch's own bookkeeping."""
    child = textwrap.dedent("""
        import json, os, time
        parent = os.getppid()
        def nices():  # the wrapper's threads: nice is field 19 of /proc/PID/task/TID/stat
            found = {}
            for tid in os.listdir(f"/proc/{parent}/task"):
                try:
                    found[tid] = int(open(f"/proc/{parent}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[16])
                except OSError:
                    pass
            return found
        deadline = time.monotonic() + 10
        lowered = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 10)
        while set(nices().values()) != {lowered} and time.monotonic() < deadline:
            time.sleep(0.05)  # the wrapper starts its threads and lowers them after starting us
        print(json.dumps({"own": os.getpriority(os.PRIO_PROCESS, 0), "wrapper": sorted(set(nices().values())),
                          "threads": len(nices())}))
    """)
    out = gw_run(PY, "-c", child)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen["own"] == base
    assert seen["wrapper"] == [min(19, base + 10)] and seen["threads"] > 1  # its writer, sampler, ingest too


def test_sigterm_to_the_wrapper_is_forwarded_to_the_child(tmp_path):
    marker = tmp_path / "child-got-term"
    child = textwrap.dedent(f"""
        import signal, sys, time
        def on_term(*a):
            open({str(marker)!r}, "w").close()
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([*GPUWATCH, "run", "--", PY, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0  # the child handled it and exited cleanly
    assert marker.exists()
    assert runs()[0]["status"] == "finished"


def test_instrumented_child_adds_its_steps_to_the_wrapper_run():
    child = textwrap.dedent("""
        import gpuwatch
        with gpuwatch.track(name="inner", config={"lr": 0.5}) as run:
            for _ in range(3):
                run.step(tokens=128)
    """)
    out = gw_run(PY, "-c", child, name="outer")
    assert out.returncode == 0, out.stderr
    (r,) = runs()  # one run, not two
    assert (r["name"], r["status"]) == ("outer", "finished")
    assert steps(r["run_id"]) == [(1, 128), (2, 128), (3, 128)]
    shown = subprocess.run([*GPUWATCH, "show", "outer"], capture_output=True, text=True).stdout
    assert "  lr  0.5" in shown and "steps     3" in shown  # the child's config, on the wrapper's run


def test_oom_in_an_instrumented_child_marks_the_wrapper_run_oom():
    child = textwrap.dedent("""
        import gpuwatch
        with gpuwatch.track() as run:
            run.step(tokens=1)
            raise MemoryError("host out of memory")
    """)
    out = gw_run(PY, "-c", child)
    assert out.returncode == 1 and "MemoryError" in out.stderr
    (r,) = runs()
    assert (r["status"], r["exit_code"], r["error_type"]) == ("oom", 1, "MemoryError")


def test_ranks_under_the_wrapper_get_their_own_runs_with_the_wrapper_as_parent():
    child = textwrap.dedent("""
        import os, subprocess, sys
        code = "import gpuwatch\\nwith gpuwatch.track() as r: r.step(tokens=int(__import__('os').environ['RANK']) + 1)"
        procs = [subprocess.Popen([sys.executable, "-c", code],
                                  env=dict(os.environ, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE="2"))
                 for i in range(2)]
        sys.exit(max(p.wait() for p in procs))
    """)
    out = gw_run(PY, "-c", child, name="job")
    assert out.returncode == 0, out.stderr
    wrapper = next(r for r in runs() if r["name"] == "job")
    ranks = sorted((r for r in runs() if r["parent_run_id"] == wrapper["run_id"]), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"], r["job_id"], r["status"]) for r in ranks] == [
        (0, 2, wrapper["run_id"], "finished"),
        (1, 2, wrapper["run_id"], "finished"),
    ]
    assert [steps(r["run_id"]) for r in ranks] == [[(1, 1)], [(1, 2)]]


def test_a_missing_program_is_one_clear_line_and_a_failed_run():
    out = gw_run("no-such-program-xyz")
    assert out.returncode == 1
    # (the embedded sampler may log a line of its own before it)
    assert (
        out.stderr.strip().splitlines()[-1]
        == "Error: cannot run 'no-such-program-xyz': No such file or directory"
    )
    assert (runs()[0]["status"], runs()[0]["exit_code"]) == ("failed", 127)


def test_default_names():
    assert default_name(("python", "-u", "train.py", "--lr", "1")) == "train.py"
    assert default_name(("torchrun", "--nproc-per-node", "8", "/src/pretrain.py")) == "pretrain.py"
    assert default_name(("python3", "-m", "pkg.train")) == "pkg.train"
    assert default_name(("/usr/bin/make", "all")) == "make"

"""`gpuwatch tui` in a real terminal (tmux, 80x24) while a writer fills the database; then the
terminal goes away (the tmux session is killed, as an SSH hang-up would) and it must exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from systools import needs_tools

from gpuwatch.store import Writer, now_ms

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
GiB = 2**30
GREYS = set(range(232, 256)) | {0, 7, 8, 15, 16, 231}  # xterm-256 greyscale ramp, black, white

pytestmark = needs_tools("tmux")


def populate(writer: Writer, now: int, n_gpus: int = 8, n_procs: int = 50, n_runs: int = 20) -> None:
    """Static facts a daemon would have written: GPUs, processes, runs with steps."""
    writer.insert(
        "gpus",
        [
            dict(
                gpu_index=i,
                uuid=f"GPU-{i:04d}",
                name="NVIDIA H100 80GB HBM3",
                mem_total_bytes=80 * GiB,
                power_limit_mw=700_000,
                first_seen_ms=now - 3600_000,
                last_seen_ms=now,
            )
            for i in range(n_gpus)
        ],
    )
    users = ["alice", "bob", "carol", "dave", "erin"]
    writer.insert(
        "processes",
        [
            dict(
                pid=10_000 + k,
                start_ms=now - 3600_000,
                uid=2000 + k % 5,
                user=users[k % 5],
                cmdline=f"python train.py --shard {k}",
                run_id=f"run-{k % n_runs:02d}" if k < n_runs else None,
                first_seen_ms=now - 3600_000,
                last_seen_ms=now,
            )
            for k in range(n_procs)
        ],
    )
    statuses = ["running", "finished", "failed", "oom", "killed"]
    runs, steps = [], []
    for r in range(n_runs):
        status = statuses[r % len(statuses)] if r >= 4 else "running"
        started = now - (r + 1) * 1800_000
        runs.append(
            dict(
                run_id=f"run-{r:02d}",
                name=f"exp-{r:02d}",
                uid=2000 + r % 5,
                user=users[r % 5],
                pid=10_000 + r,
                host="node-1",
                status=status,
                started_ms=started,
                ended_ms=None if status == "running" else started + 900_000,
                gpu_uuids=f"GPU-{r % n_gpus:04d}" if n_gpus else None,
                config_json=json.dumps({"lr": 3e-4, "seq": 65536}),
                job_id=f"job-{r:02d}",
                rank=0,
                world_size=1,
            )
        )
        for s in range(120):
            steps.append(
                dict(
                    run_id=f"run-{r:02d}",
                    step=s,
                    ts_ms=started + s * 7_000,
                    tokens=65536,
                    step_time_ms=400 + s % 7,
                    tokens_per_s=65536 / 0.4,
                    mem_allocated_bytes=(30 + s % 10) * GiB,
                    mem_reserved_bytes=45 * GiB,
                    mem_peak_bytes=50 * GiB,
                )
            )
    writer.insert("runs", runs)
    writer.insert("steps", steps)


def write_tick(writer: Writer, ts: int, n_gpus: int = 8, n_procs: int = 50) -> None:
    """One sampler tick: every GPU, its processes, the host."""
    phase = (ts // 1000) % 60
    writer.insert(
        "gpu_samples",
        [
            dict(
                gpu_index=i,
                ts_ms=ts,
                gpu_util_pct=(phase + 11 * i) % 100,
                mem_used_bytes=(10 + i * 8) * GiB,
                temp_c=50 + i,
                power_mw=300_000 + i,
                throttle_reasons=0x4 if i == 7 else 0,
            )
            for i in range(n_gpus)
        ],
    )
    writer.insert(
        "gpu_process_samples",
        [
            dict(
                gpu_index=k % n_gpus,
                pid=10_000 + k,
                ts_ms=ts,
                kind="compute",
                used_mem_bytes=(k + 1) * 2**28,
                sm_util_pct=k % 100,
                cpu_pct=float(k),
            )
            for k in range(n_procs if n_gpus else 0)
        ],
    )
    writer.insert(
        "host_samples",
        [
            dict(
                ts_ms=ts,
                cpu_pct=25.0,
                load1=3.0,
                mem_total_bytes=512 * GiB,
                mem_used_bytes=100 * GiB,
                shm_total_bytes=256 * GiB,
                shm_used_bytes=GiB,
            )
        ],
    )


def populated_db(path: Path) -> Path:
    """A database file with a daemon's static facts and one sampler tick."""
    writer = Writer(path)
    populate(writer, now_ms())
    write_tick(writer, now_ms())
    writer.close()
    return path


class SamplerThread(threading.Thread):
    """Writes a tick every `period` seconds until stopped, like the daemon's sampler."""

    def __init__(self, writer: Writer, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.writer, self.period, self.stopped = writer, period, threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            write_tick(self.writer, now_ms())
            self.stopped.wait(self.period)


class Tmux:
    def __init__(self, name: str) -> None:
        self.base = ["tmux", "-L", name]

    def __call__(self, *args: str) -> str:
        return subprocess.run(self.base + list(args), check=True, capture_output=True, text=True).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "tui")

    def wait_for(self, *texts: str, timeout: float = 15) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(t in screen for t in texts):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{texts} not on screen after {timeout}s:\n{self.screen()}")


def test_tui_in_real_terminal_then_hangup(tmp_path):
    db = tmp_path / "gw.db"
    writer = Writer(db)
    populate(writer, now_ms())
    sampler = SamplerThread(writer)
    sampler.start()
    writer.flush()
    tmux = Tmux(f"gwtest-{os.getpid()}")
    try:
        tmux(
            "new-session",
            "-d",
            "-s",
            "tui",
            "-x",
            "80",
            "-y",
            "24",
            f"exec {GPUWATCH} tui --db {db} --refresh 0.5",
        )
        pid = int(tmux("display-message", "-p", "-t", "tui", "#{pane_pid}").strip())
        screen = tmux.wait_for("GPU processes: 50", "power cap", "live")
        assert "/dev/shm" in screen
        tmux("send-keys", "-t", "tui", "r")
        tmux.wait_for("Runs: 20")
        tmux("send-keys", "-t", "tui", "f")  # running only
        tmux.wait_for("Runs: 7 · status running")
        tmux("send-keys", "-t", "tui", "Enter")
        tmux.wait_for("tokens/s", "who/where", "step time")
        assert psutil.Process(pid).is_running()

        tmux("kill-session", "-t", "tui")  # the terminal goes away
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("gpuwatch tui still running 5 s after its terminal went away")
    finally:
        subprocess.run(tmux.base + ["kill-server"], capture_output=True)
        sampler.stopped.set()
        sampler.join()
        writer.close()


def test_no_color_terminal_gets_no_colours(tmp_path):
    db = populated_db(tmp_path / "gw.db")
    tmux = Tmux(f"gwtest-nc-{os.getpid()}")
    try:
        tmux(
            "new-session",
            "-d",
            "-s",
            "tui",
            "-x",
            "80",
            "-y",
            "24",
            f"NO_COLOR=1 TERM=tmux-256color exec {GPUWATCH} tui --db {db}",
        )
        tmux.wait_for("GPU processes: 50")
        screen = tmux("capture-pane", "-p", "-e", "-t", "tui")
        # Textual renders NO_COLOR as monochrome: shades of grey only, e.g. no red "power cap".
        palette = {int(n) for n in re.findall(r"[34]8;5;(\d+)", screen)}
        assert palette and palette <= GREYS, sorted(palette - GREYS)
        assert "38;2;" not in screen and "48;2;" not in screen
    finally:
        subprocess.run(tmux.base + ["kill-server"], capture_output=True)


def test_cli_and_source_import_no_textual_torch_or_collectors():
    code = (
        "import sys, gpuwatch.cli, gpuwatch.cli.tui_cmd, gpuwatch.tui.source; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'torch') "
        "or m.startswith('gpuwatch.collectors')]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# What the TUI would load without needing it, and what it cost: Rich's emoji table (a str column
# label goes through markup) 1.5 MB; the Fleet screen and its model, for a user with no fleet.
NOT_NEEDED = ("rich._emoji_codes", "gpuwatch.tui.screens.fleet", "gpuwatch.fleet.model")
SHOW_TABLES = """
import asyncio, sys
from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.source import StoreSource

async def shown(pilot, table_id):
    for _ in range(100):
        await pilot.pause(0.05)
        tables = pilot.app.screen.query(table_id)
        if tables and tables.first().row_count:
            return
    sys.exit(f"{table_id} stayed empty")

async def main():
    app = GpuwatchApp(StoreSource(sys.argv[1]), refresh_s=0.2)
    async with app.run_test(size=(160, 48)) as pilot:
        await shown(pilot, "#processes")
        await pilot.press("r")
        await shown(pilot, "#runs")
    print(" ".join(m for m in sys.argv[2:] if m in sys.modules) or "none")

asyncio.run(main())
"""


def test_the_tui_loads_only_what_its_screens_show(tmp_path):
    db = populated_db(tmp_path / "gw.db")
    result = subprocess.run(
        [sys.executable, "-c", SHOW_TABLES, str(db), *NOT_NEEDED], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["none"], f"loaded without need: {result.stdout}"


def test_tui_refuses_without_a_terminal_and_names_a_bad_database(tmp_path):
    result = subprocess.run(
        [GPUWATCH, "tui", "--db", str(tmp_path / "gw.db")],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 1 and "needs a terminal" in result.stderr

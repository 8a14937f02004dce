"""TUI overhead in a real pty: idle CPU, bytes written to the terminal per second, first paint.

A database with 8 GPUs, 50 GPU processes and 20 runs (5 minutes of 1 Hz samples), the TUI
refreshing at 1 Hz at 80x24 and 160x48. "idle": nothing writes the database; "daemon": like the
daemon's sampler, GPUs and the host every second and process samples every 5 s
(process_interval), each time with new SM% and CPU% for every process. With --nvitop, nvitop
(installed in a venv of its own: `python3 -m venv /tmp/nv && /tmp/nv/bin/pip install nvitop`)
runs in the same way on tests/fake_pynvml.py (through bench/nvitop_shim: 8 simulated H100s
whose figures change every second, 50 real `sleep` processes spread over them), refreshing every
second. "textual plain" is bench/textual_plain.py: the same screen written plainly in Textual,
with no gpuwatch code: what Textual itself costs at this content. Goals (issue 12): CPU <= 1 %
of one core, <= 1000 B/s to the terminal at 80x24 and <= 2x nvitop's, <= 2000 B/s at 160x48,
RSS <= 40 MB, first paint <= 1.5 s. `--by-row` says
which screen rows the bytes went to. Prints figures; asserts nothing.

"first paint" is the overview's frame on the terminal, "first data" the process table filled
from the store. Like an installed package, the TUI runs with a bytecode cache (in a temporary
PYTHONPYCACHEPREFIX, warmed by one start that is reported as "cold start").

    .venv/bin/python bench/bench_tui.py [--seconds 20] [--by-row] [--soak 600] [--nvitop /tmp/nv/bin/nvitop]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
from test_tui_terminal import SamplerThread, populate, write_tick  # noqa: E402

from gpuwatch.store import Writer, now_ms  # noqa: E402

GPUWATCH = str(Path(sys.executable).with_name("gpuwatch"))
FIRST_PAINT_MARK = b"GPU processes"
FIRST_DATA_MARK = b"train.py"  # a command line in the process table
PROCESS_INTERVAL_S = 5  # the daemon's default process_interval, as ProcessChurn writes it


def make_db(path: Path) -> Writer:
    writer = Writer(path)
    now = now_ms()
    populate(writer, now)
    for k in range(300):
        write_tick(writer, now - (300 - k) * 1000)
    writer.flush()
    return writer


class ProcessChurn(SamplerThread):
    """GPU ticks every second; a process tick with new SM% / CPU% every `every` ticks."""

    def __init__(self, writer: Writer, every: int = PROCESS_INTERVAL_S) -> None:
        super().__init__(writer, period=1.0)
        self.every = every

    def run(self) -> None:
        tick = 0
        while not self.stopped.is_set():
            ts = now_ms()
            write_tick(self.writer, ts, n_procs=0)
            if tick % self.every == 0:
                self.writer.insert(
                    "gpu_process_samples",
                    [
                        dict(
                            gpu_index=k % 8,
                            pid=10_000 + k,
                            ts_ms=ts,
                            kind="compute",
                            used_mem_bytes=(k + 1) * 2**28,
                            sm_util_pct=(k + tick) % 100,
                            cpu_pct=float((k * tick) % 300),
                        )
                        for k in range(50)
                    ],
                )
            tick += 1
            self.stopped.wait(self.period)


def gpuwatch_tui(db: Path, pycache: Path) -> tuple[list[str], dict, bytes, bytes]:
    """The command, environment, first-paint and first-data marks for `gpuwatch tui`."""
    env = {"PYTHONPYCACHEPREFIX": str(pycache)}
    return [GPUWATCH, "tui", "--db", str(db), "--refresh", "1"], env, FIRST_PAINT_MARK, FIRST_DATA_MARK


def textual_plain(pycache: Path) -> tuple[list[str], dict, bytes, bytes]:
    """bench/textual_plain.py: the overview's screen written plainly in Textual, no gpuwatch code."""
    return (
        [sys.executable, str(Path(__file__).with_name("textual_plain.py"))],
        {"PYTHONPYCACHEPREFIX": str(pycache)},
        FIRST_PAINT_MARK,
        FIRST_DATA_MARK,
    )


def nvitop_tui(nvitop: str, pids: list[int]) -> tuple[list[str], dict, bytes, bytes]:
    """nvitop on the simulated NVML (bench/nvitop_shim): 8 GPUs, `pids` spread over them."""
    env = {
        "PYTHONPATH": str(Path(__file__).with_name("nvitop_shim")),
        "GPUWATCH_TESTS": str(TESTS),
        "NVITOP_FAKE_PIDS": ",".join(map(str, pids)),
    }
    return (
        [nvitop, "--interval", "1", "--readonly"],
        env,
        b"Processes",
        b"700W",
    )  # at 80x24 it shows no processes


def measure(tool: tuple[list[str], dict, bytes, bytes], cols: int, rows: int, seconds: float) -> dict:
    argv, env, paint_mark, data_mark = tool
    start = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ.update(env)
        os.execv(argv[0], argv)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    received = bytearray()
    window = bytearray()  # what was written during the measured window, for --by-row
    counted = [0]
    recording = threading.Event()
    first_paint, first_data = [None], [None]
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    data = os.read(fd, 65536)
                except OSError:
                    return
                if not data:
                    return
                counted[0] += len(data)
                if recording.is_set():
                    window.extend(data)
                if first_data[0] is None:
                    received.extend(data)
                    if first_paint[0] is None and paint_mark in received:
                        first_paint[0] = time.monotonic() - start
                    if data_mark in received:
                        first_data[0] = time.monotonic() - start

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    proc = psutil.Process(pid)
    while first_data[0] is None and time.monotonic() - start < 30:
        time.sleep(0.05)
    # Let start-up work settle, through one process tick: the first change to the process table
    # after start resends the whole table once (Textual keeps the repaint region the table had
    # before the first layout until the table next changes), a one-off ~1.2 kB, not a rate.
    time.sleep(3 + PROCESS_INTERVAL_S)
    cpu0, bytes0, t0 = sum(proc.cpu_times()[:2]), counted[0], time.monotonic()
    rss0 = proc.memory_info().rss
    recording.set()
    time.sleep(seconds)
    cpu1, bytes1, t1 = sum(proc.cpu_times()[:2]), counted[0], time.monotonic()
    recording.clear()
    rss = proc.memory_info().rss
    os.write(fd, b"q")
    try:
        proc.wait(10)
    except psutil.TimeoutExpired:
        proc.kill()
    stop.set()
    thread.join()
    os.close(fd)
    return {
        "first_paint_s": first_paint[0],
        "first_data_s": first_data[0],
        "cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100,
        "bytes_per_s": (bytes1 - bytes0) / (t1 - t0),
        "rss_bytes": rss,
        "rss_start_bytes": rss0,
        "by_row": {row: n / (t1 - t0) for row, n in bytes_by_row(bytes(window)).items()},
    }


CURSOR_TO = re.compile(rb"\x1b\[(\d+);\d+H")


def bytes_by_row(output: bytes) -> dict[int, int]:
    """Bytes written per screen row (1-based): Textual moves the cursor to each changed line
    before writing it, so every byte up to the next move belongs to that row."""
    rows: dict[int, int] = {}
    row, at = 0, 0
    for move in CURSOR_TO.finditer(output):
        rows[row] = rows.get(row, 0) + move.start() - at
        row, at = int(move.group(1)), move.start()
    rows[row] = rows.get(row, 0) + len(output) - at
    return rows


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--by-row", action="store_true", help="also print terminal bytes/s per screen row")
    parser.add_argument(
        "--soak",
        type=float,
        default=0,
        metavar="SECONDS",
        help="also keep gpuwatch open this long at 160x48 with the daemon writing: RSS at start and end",
    )
    parser.add_argument(
        "--nvitop",
        metavar="PATH",
        help="an nvitop executable (in a venv of its own) to "
        "measure beside gpuwatch, on the simulated NVML with 50 real processes",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        writer = make_db(db)
        gpuwatch = gpuwatch_tui(db, Path(tmp) / "pycache")
        plain = textual_plain(Path(tmp) / "pycache")
        print(
            f"gpuwatch tui, 8 GPUs / 50 processes / 20 runs, refresh 1 s, {args.seconds:.0f} s windows, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        cold = measure(gpuwatch, 80, 24, 1)
        print(
            f"cold start (no bytecode cache yet): first paint {_secs(cold['first_paint_s'])}, "
            f"first data {_secs(cold['first_data_s'])}"
        )
        sleepers = [subprocess.Popen(["sleep", "3600"]) for _ in range(50)] if args.nvitop else []
        try:
            print(
                f"{'tool':>8}  {'size':>7}  {'data':>6}  {'first paint':>11}  {'first data':>10}  "
                f"{'CPU % of a core':>15}  {'terminal B/s':>12}  {'RSS MB':>6}"
            )
            for cols, rows in ((80, 24), (160, 48)):
                runs = [("gpuwatch", "idle"), ("gpuwatch", "daemon"), ("textual", "plain")]
                if args.nvitop:
                    runs.append(("nvitop", "NVML"))
                for name, mode in runs:
                    sampler = ProcessChurn(writer) if mode == "daemon" else None
                    if sampler:
                        sampler.start()
                    tool = (
                        gpuwatch
                        if name == "gpuwatch"
                        else plain
                        if name == "textual"
                        else nvitop_tui(args.nvitop, [p.pid for p in sleepers])
                    )
                    r = measure(tool, cols, rows, args.seconds)
                    if sampler:
                        sampler.stopped.set()
                        sampler.join()
                    print(
                        f"{name:>8}  {cols:>3}x{rows:<3}  {mode:>6}  {_secs(r['first_paint_s']):>11}  "
                        f"{_secs(r['first_data_s']):>10}  {r['cpu_pct']:>15.2f}  {r['bytes_per_s']:>12.0f}  "
                        f"{r['rss_bytes'] / 1e6:>6.1f}"
                    )
                    if args.by_row:
                        print(
                            "          bytes/s by row: "
                            + "  ".join(f"{row}:{n:.0f}" for row, n in sorted(r["by_row"].items()) if n >= 1)
                        )
        finally:
            for p in sleepers:
                p.kill()
                p.wait()
        if args.soak:
            sampler = ProcessChurn(writer)
            sampler.start()
            r = measure(gpuwatch, 160, 48, args.soak)
            sampler.stopped.set()
            sampler.join()
            print(
                f"left open {args.soak:.0f} s at 160x48, daemon writing: RSS {r['rss_start_bytes'] / 1e6:.1f} MB "
                f"-> {r['rss_bytes'] / 1e6:.1f} MB, CPU {r['cpu_pct']:.2f} %"
            )
        print(
            f"goals: first paint <= 1.5 s; CPU <= 1 %; <= 1000 B/s at 80x24 (and <= 2x nvitop's), "
            f"<= 2000 B/s at 160x48; RSS <= 40 MB; load average now {os.getloadavg()[0]:.1f}"
        )
        writer.close()


if __name__ == "__main__":
    main()

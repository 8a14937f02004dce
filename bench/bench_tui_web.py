"""`gpuwatch tui --web`: first paint in a real headless Chromium, and the server's CPU while idle.

The database of bench_tui.py (8 GPUs, 50 GPU processes, 20 runs, nothing writing). "first
paint": from asking the browser for the page to the TUI's frame on its terminal (then the
process table: the first snapshot read from the store).
"server CPU": the aiohttp server alone with no browser, then server + the app process it
started for a connected browser tab. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_tui_web.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_tui import make_db  # noqa: E402
from test_tui_web import launch_chromium, open_tui_page, start_web, wait_for_screen  # noqa: E402


def cpu_pct(procs: list[psutil.Process], seconds: float) -> float:
    before, t0 = sum(sum(p.cpu_times()[:2]) for p in procs), time.monotonic()
    time.sleep(seconds)
    return (sum(sum(p.cpu_times()[:2]) for p in procs) - before) / (time.monotonic() - t0) * 100


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        make_db(db).close()
        server, url = start_web(db)
        try:
            print(
                f"gpuwatch tui --web, 8 GPUs / 50 processes / 20 runs, {args.seconds:.0f} s windows, "
                f"load average {os.getloadavg()[0]:.1f}"
            )
            proc = psutil.Process(server.pid)
            time.sleep(2)
            print(
                f"server alone, no browser: CPU {cpu_pct([proc], args.seconds):.2f} % of a core, "
                f"RSS {proc.memory_info().rss / 1e6:.1f} MB"
            )
            with sync_playwright() as p:
                browser = launch_chromium(p)
                try:
                    for attempt in ("first", "second"):
                        start = time.monotonic()
                        page = open_tui_page(browser, url)
                        loaded = time.monotonic() - start
                        wait_for_screen(page, "q Quit")  # the footer: the frame is on screen
                        painted = time.monotonic() - start
                        wait_for_screen(page, "GPU processes: 50")
                        print(
                            f"{attempt} page load: page loaded {loaded:.2f} s, first paint {painted:.2f} s, "
                            f"process table {time.monotonic() - start:.2f} s"
                        )
                        if attempt == "first":
                            page.close()
                            time.sleep(1)
                    time.sleep(3)  # let start-up work settle
                    procs = [proc] + proc.children(recursive=True)
                    pct = cpu_pct(procs, args.seconds)
                    print(
                        f"a tab open, nothing changing: CPU {pct:.2f} % of a core (server + {len(procs) - 1} "
                        f"app process), RSS {sum(q.memory_info().rss for q in procs) / 1e6:.1f} MB"
                    )
                finally:
                    browser.close()
        finally:
            server.terminate()
            server.wait(10)
        print(f"load average now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

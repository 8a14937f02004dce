"""Regenerates docs/images/alerts-screen.png: the TUI's Alerts screen, over alerts the real rules
wrote. A daemon on simulated GPUs (tests/fake_pynvml.py) sees a process hold memory on an idle GPU,
a GPU fall off the bus and a run fail; then the real app, at 100x30, is saved as SVG and
photographed by headless Chromium.

Usage: python docs/alerts_screenshot.py   (needs the dev install and Debian's chromium)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "images" / "alerts-screen.png"


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="gw-shot-", dir="/tmp"))
    os.environ.update(
        XDG_RUNTIME_DIR=str(work),
        XDG_DATA_HOME=str(work / "data"),
        GPUWATCH_CONFIG=str(work / "none.toml"),
        PYTHONPATH=str(REPO),
    )
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    import fake_pynvml

    from gpuwatch.base.config import Config
    from gpuwatch.daemon.main import Daemon
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.source import StoreSource

    holder = subprocess.Popen(["sleep", "600"])
    nvml = fake_pynvml.FakeNvml(gpus=4, procs={0: [holder.pid]})
    nvml.set_util(0, 0)
    nvml.set_lost(3)
    cfg = Config(db=str(work / "gw.db"), system=False, interval=0.5, host_interval=0.5, idle_gpu_minutes=0.05)
    daemon = Daemon(cfg, nvml_module=nvml)
    thread = threading.Thread(target=lambda: asyncio.run(daemon.serve()))
    thread.start()
    try:
        while not cfg.socket_path.exists():
            time.sleep(0.1)
        gpuwatch = Path(sys.executable).parent / "gpuwatch"
        subprocess.run(
            [
                str(gpuwatch),
                "run",
                "--no-instrument",
                "--name",
                "train-7b",
                "--",
                sys.executable,
                "-c",
                "import sys; sys.exit(1)",
            ],
            check=False,
        )
        subprocess.run([str(gpuwatch), "run", "--no-instrument", "--name", "eval", "--", "true"], check=False)
        time.sleep(6)  # the idle GPU's 3 s threshold, and the checks after the runs' ends

        async def shoot() -> None:
            app = GpuwatchApp(StoreSource(cfg.db), refresh_s=60, start_mode="alerts")
            async with app.run_test(size=(100, 30)) as pilot:
                for _ in range(100):
                    await pilot.pause(0.1)
                    if app.screen.query_one("#alerts").row_count >= 4:
                        break
                await pilot.press("down")
                await pilot.pause(0.3)
                app.save_screenshot(str(work / "alerts.svg"))

        asyncio.run(shoot())
    finally:
        daemon.request_stop()
        thread.join(30)
        holder.kill()
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={work / 'chromium'}",
            "--window-size=1220,780",
            f"--screenshot={OUT}",
            f"file://{work / 'alerts.svg'}",
        ],
        check=True,
        stderr=subprocess.DEVNULL,
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

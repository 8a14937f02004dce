"""Take the docs' pictures of the TUI from the real app: `python tools/screenshots.py docs/img`.

Runs `gpuwatch demo --no-tui` (with scheduled profiling on, so its training run has a profile)
into a temporary database, samples the tests' simulated GPUs (tests/fake_pynvml.py, named
"(simulated)") into the same file for a few seconds, then opens the real `GpuwatchApp` headless
on it and saves each screen as an SVG at 80x24 and 160x48. A change to a screen changes its
picture: commit the new SVGs with it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIZES = [(80, 24), (160, 48)]
SAMPLE_S = 8.0  # a few seconds of samples: sparklines with some history, a process table


def run_demo(db: Path, home: Path) -> None:
    env = dict(
        os.environ,
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        XDG_RUNTIME_DIR=str(home / "run"),
        GPUWATCH_CONFIG=str(home / "none.toml"),
        # one 3-step torch.profiler window in the training run: the Profile screen's data
        GPUWATCH_PROFILE_WAIT="2",
        GPUWATCH_PROFILE_ACTIVE="3",
        GPUWATCH_PROFILE_REPEAT="1",
    )
    (home / "run").mkdir(mode=0o700, parents=True, exist_ok=True)
    print(f"screenshots: running `gpuwatch demo --no-tui` into {db} (about a minute) ...", flush=True)
    subprocess.run(
        [sys.executable, "-c", "from gpuwatch.cli import main; main()", "demo", "--no-tui", "--db", str(db)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=900,
    )


def sample_simulated_gpus(db: Path) -> None:
    """The daemon's own sampler on 8 simulated GPUs, with this process on four of them."""
    sys.path.insert(0, str(REPO / "tests"))
    import fake_pynvml

    from gpuwatch.base.config import Config
    from gpuwatch.monitor.sampler import Sampler
    from gpuwatch.store import Writer

    me = os.getpid()
    # A short name, so that "(simulated)" survives the NAME column; GPM (SM, tensor, DRAM
    # activity) on the first four, as on Hopper.
    nvml = fake_pynvml.FakeNvml(
        gpus=8, name="H100 (simulated)", procs={0: [me], 1: [me], 2: [me], 3: [me]}, gpm={0, 1, 2, 3}
    )
    cfg = Config(db=str(db), interval=0.5, host_interval=0.5, process_interval=1.0)
    writer = Writer(cfg.db_path)
    sampler = Sampler(writer, cfg, nvml_module=nvml)
    print(f"screenshots: sampling 8 simulated GPUs for {SAMPLE_S:.0f} s ...", flush=True)
    sampler.start()
    try:
        time.sleep(SAMPLE_S)
    finally:
        sampler.stop()
        writer.close()


def run_ids(db: Path) -> dict[str, str]:
    from gpuwatch.store import open_ro, queries

    conn = open_ro(str(db))
    try:
        return {r.name: r.run_id for r in queries.runs(conn, limit=20)}
    finally:
        conn.close()


async def shoot(db: Path, out: Path, size: tuple[int, int], runs: dict[str, str]) -> list[Path]:
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.screens.oom import OomScreen
    from gpuwatch.tui.screens.profile import ProfileScreen
    from gpuwatch.tui.screens.run import RunScreen
    from gpuwatch.tui.source import StoreSource

    # The samples stop when the pictures start: do not call them stale.
    app = GpuwatchApp(StoreSource(str(db), stale_after_ms=3_600_000), refresh_s=60)
    app.title = "gpuwatch · demo data, simulated GPUs"  # the picture's window title
    train, oom = runs["demo-train"], runs["demo-oom"]
    shots = [
        ("overview", None),
        ("runs", "r"),
        ("run", RunScreen(train)),
        ("oom", OomScreen(oom)),
        ("profile", ProfileScreen(train)),
    ]
    saved = []
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        for name, how in shots:
            if isinstance(how, str):
                await pilot.press(how)
            elif how is not None:
                while len(app.screen_stack) > 1:
                    app.pop_screen()
                await app.push_screen(how)
            await settle(pilot)
            path = out / f"{name}-{size[0]}x{size[1]}.svg"
            app.save_screenshot(path.name, str(out))
            saved.append(path)
            print(f"screenshots: {path}", flush=True)
    return saved


async def settle(pilot) -> None:
    """Let the poll thread fetch and the screen paint (it polls once a screen is shown)."""
    for _ in range(3):
        pilot.app.poll_now()
        await pilot.pause(0.7)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the SVGs (docs/img)")
    parser.add_argument("--db", type=Path, help="use this database instead of running the demo")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["TZ"] = "UTC"  # the same picture wherever it is taken
    time.tzset()
    with tempfile.TemporaryDirectory(prefix="gw-shots-") as tmp:
        db = args.db
        if db is None:
            db = Path(tmp) / "demo.db"
            run_demo(db, Path(tmp))
            sample_simulated_gpus(db)
        runs = run_ids(db)
        for size in SIZES:
            asyncio.run(shoot(db, args.out, size, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`gpuwatch browse`: from asking headless Chromium for a canned query's page to its chart drawn.

A database with a long run (50,000 steps), 10,000 short runs of 20 users over 60 days (for
GPU-hours per user per day) and an OOM a day. For each charted canned query: a fresh page with
the token, timed until the chart's canvas holds coloured pixels (the plotted marks), the
median of --repeat tries after one warm-up. Goal: <= 2 s. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_browse.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_browse import open_chart, start_browse  # noqa: E402
from test_tui_web import launch_chromium  # noqa: E402

from gpuwatch.store import insert_rows, open_rw  # noqa: E402

DAY_MS = 86_400_000


def make_db(path: Path) -> None:
    rng = random.Random(1)
    now = int(time.time() * 1000)
    conn = open_rw(path)
    conn.execute("BEGIN")
    insert_rows(
        conn,
        "runs",
        [
            dict(
                run_id="long",
                name="gpt-long",
                uid=1000,
                user="alice",
                status="finished",
                started_ms=now - DAY_MS,
                ended_ms=now,
                gpu_uuids="0,1,2,3",
                command="python train.py --lr 3e-4",
                config_json=json.dumps({"lr": 3e-4}),
            )
        ],
    )
    insert_rows(
        conn,
        "steps",
        [
            dict(
                run_id="long",
                step=s,
                ts_ms=now - DAY_MS + s * 1700,
                tokens=32768,
                tokens_per_s=19000 + rng.gauss(0, 400),
                loss=4 * 0.99995**s,
                step_time_ms=1700.0,
            )
            for s in range(50_000)
        ],
    )
    runs = []
    for i in range(10_000):
        start = now - rng.randrange(60 * DAY_MS)
        runs.append(
            dict(
                run_id=f"r{i:05d}",
                name=f"sweep-{i % 50}",
                uid=1000 + i % 20,
                user=f"user{i % 20}",
                status="oom" if i % 167 == 0 else "finished",
                started_ms=start,
                ended_ms=start + rng.randrange(600_000, 8 * 3_600_000),
                gpu_uuids="0,1",
            )
        )
    insert_rows(conn, "runs", runs)
    conn.execute("COMMIT")
    conn.close()


def main() -> None:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    pages = {
        "tokens/s of a 50,000-step run": "tokens_per_s_over_time?run=gpt-long",
        "GPU-hours per user per day (10,000 runs)": "gpu_hours_per_user_per_day?days=60",
        "OOMs per week": "ooms_per_week",
    }
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "gpuwatch.db"
        make_db(db)
        server, base, token = start_browse(db)
        try:
            with sync_playwright() as p:
                browser = launch_chromium(p)
                print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
                print(f"{'canned query':<44} {'to chart (median)':>18} {'min':>8} {'max':>8}")
                for label, path in pages.items():
                    times = []
                    for attempt in range(args.repeat + 1):
                        page = browser.new_page(viewport={"width": 1200, "height": 900})
                        sep = "&" if "?" in path else "?"
                        t0 = time.perf_counter()
                        open_chart(page, f"{base}/gpuwatch/{path}{sep}token={token}", base)
                        if attempt:  # the first warms the server's caches and the browser's
                            times.append(time.perf_counter() - t0)
                        page.close()
                    print(
                        f"{label:<44} {statistics.median(times) * 1000:>15.0f} ms "
                        f"{min(times) * 1000:>5.0f} ms {max(times) * 1000:>5.0f} ms"
                    )
                browser.close()
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()

"""Hand-written queries over a day of raw samples: gpuwatch's tables against the same rows in
plain indexed tables, timed in one run; prints a table of times and ratios.

Builds a day for 8 simulated GPUs with 50 GPU processes with bench_storage.py's real Sampler
and maintain() (or reuses --db FILE if it exists), copies every raw sample into a second file
as plain rowid tables with an index on (gpu_index, ts_ms) (ts_ms for the host), and runs each
query there and through gpuwatch's documented names, alternating, best of --repeat. Prints
what a raw day costs on disk too. --db also reads, as it is, a day written by an earlier
gpuwatch that packed samples behind views (how the README's figures for it were measured).

Goals: every query <= 3x the plain table, the slowest <= 0.5 s.

    .venv/bin/python bench/bench_queries.py [--hours 24] [--db /tmp/day.db] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_storage  # noqa: E402  (the day's simulation)

RAW = ("gpu_samples", "gpu_process_samples", "host_samples")
H_MS, DAY_MS = 3_600_000, 86_400_000

# The four queries, as a user writes them (unixepoch() replaced by the day's :now),
# and one over gpu_process_samples without a GPU, which no index on (gpu_index, ts_ms) helps.
QUERIES = {
    "utilisation and peak memory per GPU, last 24 h": (
        "SELECT gpu_index, avg(gpu_util_pct), max(mem_used_bytes) FROM gpu_samples "
        "WHERE ts_ms >= :now - 86400000 GROUP BY gpu_index"
    ),
    "host CPU, last hour": (
        "SELECT avg(cpu_pct), max(cpu_pct), max(load1) FROM host_samples WHERE ts_ms >= :now - 3600000"
    ),
    "one GPU, one hour at noon": (
        "SELECT * FROM gpu_samples WHERE gpu_index = 3 AND ts_ms >= :noon AND ts_ms < :noon + 3600000 "
        "ORDER BY ts_ms"
    ),
    'the README\'s "who used GPU 3"': (
        "SELECT p.user, p.pid, p.run_id, count(*) AS samples, "
        "round(max(g.used_mem_bytes) / 1073741824.0, 1) AS max_gib, "
        "datetime(min(g.ts_ms) / 1000, 'unixepoch', 'localtime') AS first_seen, "
        "datetime(max(g.ts_ms) / 1000, 'unixepoch', 'localtime') AS last_seen "
        "FROM gpu_process_samples g "
        "JOIN processes p ON p.pid = g.pid AND g.ts_ms BETWEEN p.first_seen_ms AND p.last_seen_ms "
        "WHERE g.gpu_index = 3 AND g.ts_ms >= :now - 86400000 "
        "GROUP BY p.user, p.pid, p.run_id ORDER BY max_gib DESC"
    ),
    "GPU memory per process, last hour (all GPUs)": (
        "SELECT pid, max(used_mem_bytes), avg(sm_util_pct) FROM gpu_process_samples "
        "WHERE ts_ms >= :now - 3600000 GROUP BY pid ORDER BY pid"
    ),
}


def build(path: Path, hours: float) -> None:
    sleepers = [subprocess.Popen(["sleep", "86400"]) for _ in range(bench_storage.PROCS)]
    try:
        bench_storage.simulate(path, int(hours * 3600), [p.pid for p in sleepers])
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def plain_copy(source: Path, dest: Path) -> None:
    """The raw samples and processes as plain rowid tables with the reference indexes."""
    if dest.exists():
        dest.unlink()
    conn = sqlite3.connect(dest)
    conn.execute("ATTACH ? AS src", (str(source),))
    for table in RAW + ("processes",):
        conn.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
    conn.execute("CREATE INDEX gpu_samples_ts ON gpu_samples (gpu_index, ts_ms)")
    conn.execute("CREATE INDEX gpu_process_samples_ts ON gpu_process_samples (gpu_index, ts_ms)")
    conn.execute("CREATE INDEX host_samples_ts ON host_samples (ts_ms)")
    conn.commit()
    conn.execute("DETACH src")
    conn.close()


def same(a: list, b: list) -> bool:
    """Equal rows, floats to 12 significant digits (an average's last bits follow row order)."""

    def norm(rows: list) -> list:
        return [tuple(float(f"{v:.12g}") if isinstance(v, float) else v for v in r) for r in rows]

    return norm(a) == norm(b)


def timed(conn: sqlite3.Connection, sql: str, params: dict) -> tuple[float, list]:
    began = time.perf_counter()
    rows = conn.execute(sql, params).fetchall()
    return time.perf_counter() - began, rows


def raw_bytes(conn: sqlite3.Connection) -> dict[str, int]:
    """Bytes on disk per raw name, with whatever tables and indexes hold its samples."""
    sizes = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
    return {
        t: sum(sizes.get(n, 0) for n in (t, f"{t}_recent", f"{t}_packed", f"{t}_packed_key")) for t in RAW
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--db", default="", help="a day built before (reused if it exists)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gw-bench-q-"))
    path = Path(args.db) if args.db else work / "gpuwatch.db"
    if not path.exists():
        began = time.perf_counter()
        build(path, args.hours)
        print(
            f"built {args.hours:g} h of samples (real Sampler, maintain() every minute) "
            f"in {time.perf_counter() - began:.0f} s: {path}"
        )
    plain_path = work / "plain.db"
    plain_copy(path, plain_path)
    ours = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    plain = sqlite3.connect(f"{plain_path.resolve().as_uri()}?mode=ro", uri=True)
    oldest, now = ours.execute("SELECT min(ts_ms), max(ts_ms) FROM gpu_samples").fetchone()
    span_h = (now - oldest) / H_MS
    noon = (now - H_MS) // DAY_MS * DAY_MS + 12 * H_MS  # 12:00 UTC of the last hour's day
    if noon + H_MS > now:
        noon -= DAY_MS
    if noon < oldest:  # a day shorter than that: its middle hour
        noon = (oldest + now) // 2 // H_MS * H_MS
    params = {"now": now, "noon": noon}

    results = {}
    for label, sql in QUERIES.items():
        best = [float("inf"), float("inf")]
        for _ in range(args.repeat):
            for i, conn in enumerate((ours, plain)):
                seconds, rows = timed(conn, sql, params)
                best[i] = min(best[i], seconds)
                if i == 0:
                    got = rows
                else:
                    want = rows
        results[label] = (best, len(got), same(got, want))

    load = os.getloadavg()
    print(
        f"\n{span_h:.1f} h of raw samples, {bench_storage.GPUS} GPUs (simulated), "
        f"{bench_storage.PROCS} GPU processes; best of {args.repeat}; load average "
        f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print("| query | gpuwatch | plain indexed table | ratio | rows (same) |")
    print("|---|---|---|---|---|")
    for label, ((o, p), n, equal) in results.items():
        print(
            f"| {label} | {o * 1000:,.1f} ms | {p * 1000:,.1f} ms | {o / p:.2f}x | {n} ({'yes' if equal else 'NO'}) |"
        )
    worst = max(o for (o, _), _, _ in results.values())
    ratio = max(o / p for (o, p), _, _ in results.values())
    print(f"worst query {worst * 1000:.0f} ms, worst ratio {ratio:.2f}x  [goals: <= 500 ms, <= 3x]")

    sizes = raw_bytes(ours)
    per_day = 24 / span_h
    print(
        "raw samples on disk, tables and indexes, scaled to a day: "
        + ", ".join(f"{t} {b * per_day / 1e6:.1f} MB" for t, b in sizes.items())
        + f"; together {sum(sizes.values()) * per_day / 1e6:.1f} MB/day (file {os.path.getsize(path) / 1e6:.1f} MB)"
    )
    ours.close()
    plain.close()


if __name__ == "__main__":
    main()

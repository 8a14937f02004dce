"""Trace analysis speed and memory on a ~100 MB (uncompressed) Kineto trace: gpuwatch beside HTA.

Writes one rank's trace from tests/trace_gen.py (kernels on three streams, correlated launches
with flow events, NCCL, memcpy/memset, data loader, synchronise) until it passes --mb
megabytes, then runs, each in a subprocess of its own, `gpuwatch.analysis.trace.analyse_files`
and HTA's parse + temporal breakdown + kernel breakdown + comm/compute overlap (the figures
`gpuwatch trace` prints). Each child reports its wall time (imports included: what a user
waits for) and its peak RSS (getrusage ru_maxrss). Both temporal breakdowns are printed so the
figures are seen to agree. Goals (issue 22): >= 5x faster than HTA, <= 1/3 of its memory.

Then the latency a user sees: a tracked training loop (embedded mode, a tiny torch model on the
CPU) with a scheduled profile window of 5 steps; from the window's end (the profile's ts_ms)
to its breakdown readable in the database. Goal: <= 5 s. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_trace.py [--mb 100] [--keep DIR] [--skip-hta]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

GPUWATCH_CHILD = """
import json, resource, sys, time
t0 = time.perf_counter()
from gpuwatch.analysis.trace import analyse_files
r = analyse_files([sys.argv[1]])["ranks"][0]
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "temporal": r["temporal"], "kernels": len(r["kernels"])}))
"""

HTA_CHILD = """
import json, logging, resource, sys, time
t0 = time.perf_counter()
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir=sys.argv[2])
t = ta.get_temporal_breakdown(visualize=False).iloc[0]
ta.get_gpu_kernel_breakdown(visualize=False)
ta.get_comm_comp_overlap(visualize=False)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "temporal": {"idle_pct": float(t["idle_time_pctg"]),
                               "compute_pct": float(t["compute_time_pctg"]),
                               "non_compute_pct": float(t["non_compute_time_pctg"])}}))
"""


def write_big_trace(path: Path, mb: float) -> int:
    """A trace of about `mb` MB, written a block of steps at a time; its size in bytes."""
    from trace_gen import make_trace

    block = make_trace(rank=0, world=2, steps=40, layers=12, seed=1)
    meta = [e for e in block["traceEvents"] if "ts" not in e]
    events = [e for e in block["traceEvents"] if "ts" in e]
    head = {k: v for k, v in block.items() if k != "traceEvents"}
    span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events) + 100
    corr_span = max(e["args"].get("correlation", 0) for e in events if "args" in e) + 1
    with open(path, "w") as fh:
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        fh.write(", ".join(json.dumps(e) for e in meta))
        first, copy = not meta, 0
        while fh.tell() < mb * 1e6:
            for e in events:
                e2 = dict(e, ts=round(e["ts"] + copy * span, 3))
                if "args" in e and e["args"].get("correlation", -1) >= 0:
                    e2["args"] = dict(e["args"], correlation=e["args"]["correlation"] + copy * corr_span)
                if "id" in e:
                    e2["id"] = e["id"] + copy * corr_span
                if e.get("name", "").startswith("ProfilerStep#"):
                    n = int(e["name"].split("#")[1]) + copy * 40
                    e2["name"] = f"ProfilerStep#{n}"
                fh.write(("" if first else ", ") + json.dumps(e2))
                first = False
            copy += 1
        fh.write("]}")
    return path.stat().st_size


def run_child(code: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


TRAINER = """
import time, torch, gpuwatch
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
opt = torch.optim.AdamW(model.parameters())
with gpuwatch.track(name="bench-trace") as run:
    for _ in range(200):
        loss = model(torch.randn(64, 256)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        run.step(tokens=64, loss=loss.detach())
        time.sleep(0.01)
"""


def breakdown_latency(d: Path) -> list[float]:
    """Seconds from each profile window's end to its breakdown in the database."""
    import sqlite3

    db = d / "gw.db"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        GPUWATCH_DB=str(db),
        GPUWATCH_RUNS_DIR=str(d),
        GPUWATCH_PROFILE_WAIT="20",
        GPUWATCH_PROFILE_WARMUP="1",
        GPUWATCH_PROFILE_ACTIVE="5",
        GPUWATCH_PROFILE_REPEAT="3",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", TRAINER], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    seen: dict[int, float] = {}
    while child.poll() is None or not seen:
        if db.exists():
            try:
                conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
                rows = conn.execute(
                    "SELECT p.id, p.ts_ms FROM profiles p JOIN profile_breakdowns b ON b.profile_id = p.id"
                ).fetchall()
                conn.close()
            except sqlite3.OperationalError:
                rows = []
            for pid, ts_ms in rows:
                seen.setdefault(pid, time.time() - ts_ms / 1000.0)
        if child.poll() is not None and not seen:
            break
        time.sleep(0.05)
    return [seen[k] for k in sorted(seen)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--keep", help="directory to write the trace into and keep it")
    ap.add_argument("--skip-hta", action="store_true", help="only the latency figure")
    args = ap.parse_args()
    d = Path(args.keep or tempfile.mkdtemp(prefix="bench_trace_"))
    d.mkdir(parents=True, exist_ok=True)
    lat = breakdown_latency(d)
    print(
        f"profile window end -> breakdown in the database: "
        f"{', '.join(f'{x:.2f} s' for x in lat) or 'none arrived'} (goal <= 5 s; load "
        f"average {os.getloadavg()[0]:.2f})"
    )
    if args.skip_hta:
        return
    path = d / "rank0.json"
    t0 = time.perf_counter()
    size = write_big_trace(path, args.mb)
    print(f"trace: {size / 1e6:.1f} MB uncompressed, written in {time.perf_counter() - t0:.1f} s")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    ours = run_child(GPUWATCH_CHILD, str(path))
    theirs = run_child(HTA_CHILD, str(path), str(d))
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for name, r in (("gpuwatch", ours), ("HTA", theirs)):
        t = r["temporal"]
        print(
            f"{name:>8}: {r['wall_s']:6.1f} s, peak RSS {r['rss_kb'] / 1024:7.1f} MB; idle "
            f"{t['idle_pct']:.2f} %, compute {t['compute_pct']:.2f} %, non-compute "
            f"{t['non_compute_pct']:.2f} %"
        )
    print(
        f"gpuwatch is {theirs['wall_s'] / ours['wall_s']:.1f}x faster (goal >= 5x) and uses "
        f"{ours['rss_kb'] / theirs['rss_kb']:.2f} of HTA's peak RSS (goal <= 0.33)"
    )
    if not args.keep:
        path.unlink()


if __name__ == "__main__":
    main()

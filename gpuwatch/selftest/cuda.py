"""The CUDA paths: step timing, a real OOM and its advice, allocator stats, profiler device times,
a CUDA process seen by NVML, MIG devices. Each workload runs in a child process of gpuwatch's
own workloads (so a broken CUDA context cannot take the selftest down) on a database of its own;
each comparison is a pure function below, tested without a GPU."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuwatch.selftest.result import FAIL, OK, SKIPPED, Progress, Result, within

MiB = 2**20
TIMING_TOLERANCE = 0.02  # CUDA-event step times vs synchronised wall time, and tracked vs untracked
STATS_KEYS = (
    "num_alloc_retries",
    "num_ooms",
    "inactive_split_bytes.all.current",
    "allocated_bytes.all.current",
    "reserved_bytes.all.current",
)
_FITS = re.compile(r"L ≤ (\d+) fits")
_TIMING = """
import json, sys, time, torch, gpuwatch
steps, n = int(sys.argv[1]), 4096
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
def work():
    x = a
    for _ in range(8):
        x = x @ a
    return x
for _ in range(3):
    work()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    work()
torch.cuda.synchronize()
untracked = time.perf_counter() - t0
with gpuwatch.track(name="selftest-timing") as run:
    walls = []
    t0 = time.perf_counter()
    for i in range(steps):
        work()
        run.step(tokens=n)
    torch.cuda.synchronize()
    tracked = time.perf_counter() - t0
    work(); run.step(tokens=n)  # step 1..steps measured; one more closes the last event pair
    torch.cuda.synchronize()
    s0 = time.perf_counter()
    for i in range(steps):
        work()
        run.step(tokens=n)
    torch.cuda.synchronize()
    synced = time.perf_counter() - s0
stats = torch.cuda.memory_stats()
print(json.dumps({"run_id": run.run_id, "untracked_s": untracked, "tracked_s": tracked,
                  "synced_s": synced, "steps": steps, "stats_keys": sorted(stats)}))
"""


# ---- pure comparisons ------------------------------------------------------------------------


def timing_agreement(event_ms: float, wall_ms: float) -> Result:
    """Summed CUDA-event step times vs the synchronised wall time of the same steps."""
    return within(
        "step timing: CUDA events vs synchronised wall time",
        event_ms,
        wall_ms,
        TIMING_TOLERANCE * wall_ms,
        "ms",
        "2 %",
    )


def no_extra_sync(tracked_s: float, untracked_s: float) -> Result:
    """A tracked loop that synchronised each step would lose the CPU's run-ahead and slow down."""
    return within(
        "tracked loop adds no synchronize (time vs untracked)",
        tracked_s * 1000,
        untracked_s * 1000,
        TIMING_TOLERANCE * untracked_s * 1000,
        "ms",
        "2 %",
    )


def stats_keys(keys) -> Result:
    missing = [k for k in STATS_KEYS if k not in set(keys)]
    return Result(
        "memory_stats() keys gpuwatch stores",
        FAIL if missing else OK,
        f"missing: {', '.join(missing)}" if missing else f"all {len(STATS_KEYS)} present",
    )


def scores_bytes(batch: int, heads: int, seq_len: int, dtype_bytes: int = 4) -> int:
    """The naive attention score tensor: B·H·L² elements."""
    return batch * heads * seq_len * seq_len * dtype_bytes


def oom_length(free_bytes: int, batch: int, heads: int, dtype_bytes: int = 4) -> int:
    """A sequence length whose score tensor is half again the free memory: sure not to fit."""
    return math.isqrt(int(free_bytes * 1.5) // (batch * heads * dtype_bytes)) + 1


def fits_length(advice: list[dict]) -> int | None:
    """N of the advice's "L ≤ N fits", if it gave one."""
    for item in advice:
        m = _FITS.search(item.get("detail", ""))
        if m:
            return int(m.group(1))
    return None


OOM_MEMORY_TOLERANCE = 16 * MiB  # the allocator may round or release a block between the two reads


def oom_verdict(pm: dict, expected_bytes: int, total_bytes: int, at_oom: dict) -> list[Result]:
    """The postmortem of the naive-attention OOM against the arithmetic and torch's own figures:
    `at_oom` holds torch.cuda.mem_get_info()'s free and memory_reserved(), read by the workload
    right after the OOM (its GPUWATCH_RESULT line)."""
    phase_ok = pm.get("phase") == "forward"
    tolerance = f"{OOM_MEMORY_TOLERANCE // MiB} MiB"
    return [
        within(
            "OOM postmortem: requested = B·H·L²·4",
            pm.get("requested_bytes"),
            expected_bytes,
            0.01 * expected_bytes,
            "bytes",
            "1 %",
        ),
        within(
            "OOM postmortem: total = torch.cuda.mem_get_info()",
            pm.get("total_bytes"),
            total_bytes,
            0,
            "bytes",
            "exact",
        ),
        within(
            "OOM postmortem: free = torch.cuda.mem_get_info()",
            pm.get("free_bytes"),
            at_oom.get("free_bytes"),
            OOM_MEMORY_TOLERANCE,
            "bytes",
            tolerance,
        ),
        within(
            "OOM postmortem: reserved = torch.cuda.memory_reserved()",
            pm.get("reserved_bytes"),
            at_oom.get("reserved_bytes"),
            OOM_MEMORY_TOLERANCE,
            "bytes",
            tolerance,
        ),
        Result(
            "OOM postmortem: phase", OK if phase_ok else FAIL, f"phase {pm.get('phase')!r} (expected forward)"
        ),
    ]


def profiler_verdict(ops: list[tuple[str, float | None]]) -> Result:
    """A profiled window: the matmul operators have device (CUDA) time."""
    matmuls = [(name, us) for name, us in ops if re.search(r"mm|matmul|gemm", name)]
    timed = [(name, us) for name, us in matmuls if us]
    if not matmuls:
        return Result("profiler device times", FAIL, "no matmul operator in the profile")
    return Result(
        "profiler device times",
        OK if timed else FAIL,
        f"{len(timed)} of {len(matmuls)} matmul operators with device time "
        f"(e.g. {timed[0][0]} {timed[0][1]:.0f} µs)"
        if timed
        else "matmul operators show no device time",
    )


def process_verdict(pid: int, user: str, ours: list, smi_rows: list[dict], run_linked: bool) -> list[Result]:
    """The CUDA process selftest started, as NVML + our process collector see it vs nvidia-smi."""
    mine = [p for p in ours if p.pid == pid]
    theirs = [r for r in smi_rows if int(r.get("pid") or -1) == pid]
    if not mine or not theirs:
        return [
            Result(
                "CUDA process seen",
                FAIL,
                f"pid {pid}: gpuwatch {'sees' if mine else 'misses'} it, "
                f"nvidia-smi {'lists' if theirs else 'misses'} it",
            )
        ]
    used = sum(p.used_mem_bytes or 0 for p in mine) / MiB
    return [
        Result("CUDA process seen", OK, f"pid {pid} on GPU {mine[0].gpu_index}"),
        within(
            "CUDA process memory vs nvidia-smi",
            used,
            sum(r["used_memory"] for r in theirs),
            16,
            "MiB",
            "16 MiB",
        ),
        Result(
            "CUDA process user and run",
            OK if run_linked and user else FAIL,
            f"user {user or '?'}, {'linked to its run' if run_linked else 'not linked to its run'}",
        ),
    ]


def mig_devices_from_list(text: str) -> list[str]:
    """MIG device UUIDs from `nvidia-smi -L`."""
    return re.findall(r"\(UUID: (MIG-[^)]+)\)", text)


def mig_verdict(ours: list[str], theirs: list[str]) -> Result:
    missing, extra = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    return Result(
        "MIG devices vs nvidia-smi -L",
        FAIL if missing or extra else OK,
        f"{len(ours)} MIG devices"
        + (f"; missing {missing}" if missing else "")
        + (f"; not in nvidia-smi {extra}" if extra else ""),
    )


# ---- measuring --------------------------------------------------------------------------------


def _child(code_or_args: list[str], env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *code_or_args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _db_rows(db: Path, sql: str, *params) -> list[sqlite3.Row]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _cuda_available() -> str | None:
    """Why the CUDA checks cannot run here, or None."""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode:
        return "torch is not installed" if "No module named" in probe.stderr else probe.stderr.strip()[-200:]
    return None if probe.stdout.strip() == "True" else "torch sees no CUDA device"


def run_checks(quick: bool, progress: Progress) -> list[Result]:
    why = _cuda_available()
    names = [
        "step timing",
        "memory_stats() keys",
        "OOM postmortem",
        "profiler device times",
        "CUDA process",
        "MIG devices",
    ]
    if why:
        return [Result(name, SKIPPED, why) for name in names]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, XDG_DATA_HOME=tmp, GPUWATCH_SOCKET=os.devnull)
        env.pop("GPUWATCH_RUN_ID", None)
        db = Path(tmp) / "gpuwatch" / "gpuwatch.db"
        results = []
        progress("step timing")
        results += _timing(env, db, steps=20 if quick else 100)
        progress("OOM postmortem")
        results += _oom(env, db)
        if quick:
            return results + [Result(name, SKIPPED, "--quick") for name in names[3:5]] + _mig()
        progress("profiler")
        results += _profiler(env, db)
        progress("CUDA process")
        results += _process(env, db)
        return results + _mig()


def _timing(env: dict, db: Path, steps: int) -> list[Result]:
    done = _child(["-c", _TIMING, str(steps)], env)
    if done.returncode:
        return [
            Result("step timing", FAIL, done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
        ]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    times = [
        r[0]
        for r in _db_rows(db, "SELECT step_time_ms FROM steps WHERE run_id = ? ORDER BY step", out["run_id"])
    ]
    synced_steps = times[-steps:]  # the last loop: synchronised at both ends
    return [
        timing_agreement(sum(synced_steps), out["synced_s"] * 1000),
        no_extra_sync(out["tracked_s"], out["untracked_s"]),
        stats_keys(out["stats_keys"]),
    ]


def _workload(env: dict, *args: str) -> subprocess.CompletedProcess:
    return _child(
        [
            "-m",
            "workloads.gpt_train",
            "--device",
            "cuda",
            "--attn",
            "naive",
            "--layers",
            "1",
            "--d-model",
            "64",
            "--vocab",
            "256",
            "--steps",
            "1",
            *args,
        ],
        env,
    )


def _oom(env: dict, db: Path) -> list[Result]:
    import torch  # the selftest command only; never at import time

    batch, heads = 2, 4
    free, total = torch.cuda.mem_get_info()
    length = oom_length(free, batch, heads)
    done = _workload(
        env, "--batch", str(batch), "--heads", str(heads), "--seq-len", str(length), "--name", "selftest-oom"
    )
    rows = _db_rows(
        db, "SELECT o.* FROM oom_postmortems o JOIN runs r USING (run_id) WHERE r.name = 'selftest-oom'"
    )
    if not rows:
        return [Result("OOM postmortem", FAIL, f"no postmortem for naive attention at L={length}")]
    pm = dict(rows[0])
    from workloads.common import parse_result

    try:
        at_oom = parse_result(done.stdout)
    except ValueError:
        at_oom = {}
    results = oom_verdict(pm, scores_bytes(batch, heads, length), total, at_oom)
    fits = fits_length(json.loads(pm["advice_json"] or "[]"))
    if fits is None:
        return results + [Result("OOM advice: L ≤ N fits", FAIL, "the advice names no length that fits")]
    done = _workload(
        env, "--batch", str(batch), "--heads", str(heads), "--seq-len", str(fits), "--name", "selftest-fits"
    )
    ran = '"oom": false' in done.stdout
    return results + [
        Result(
            "OOM advice: L ≤ N fits",
            OK if ran else FAIL,
            f"the advice's L ≤ {fits} {'ran without an OOM' if ran else 'did not fit'}",
        )
    ]


def _profiler(env: dict, db: Path) -> list[Result]:
    done = _workload(
        dict(env, GPUWATCH_PROFILE_ACTIVE="2", GPUWATCH_PROFILE_WAIT="1"),
        "--steps",
        "6",
        "--seq-len",
        "1024",
        "--batch",
        "4",
        "--heads",
        "4",
        "--name",
        "selftest-profile",
    )
    ops = _db_rows(
        db,
        "SELECT o.name, o.device_total_us FROM profile_ops o JOIN profiles p ON p.id = o.profile_id "
        "JOIN runs r USING (run_id) WHERE r.name = 'selftest-profile'",
    )
    if not ops:
        return [Result("profiler device times", FAIL, f"no profile stored ({done.stderr.strip()[-200:]})")]
    return [profiler_verdict([(r[0], r[1]) for r in ops])]


_HOLDER = """
import sys, time, torch, gpuwatch
with gpuwatch.track(name="selftest-process") as run:
    x = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    run.step(tokens=1)
    print(run.run_id, flush=True)
    time.sleep(30)
"""


def _process(env: dict, db: Path) -> list[Result]:
    import getpass

    from collectors.nvml import NvmlCollector
    from collectors.processes import ProcessCollector
    from gpuwatch.selftest.smi import query

    child = subprocess.Popen([sys.executable, "-c", _HOLDER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        run_id = child.stdout.readline().strip()
        collector = NvmlCollector()
        try:
            _, ours = collector.sample(0)
        finally:
            collector.close()
        smi_rows = query("compute-apps", ["pid", "used_memory"])
        info = ProcessCollector().info(child.pid)
        linked = bool(_db_rows(db, "SELECT 1 FROM runs WHERE run_id = ? AND pid = ?", run_id, child.pid))
        return process_verdict(child.pid, info.user if info else "", ours, smi_rows, linked) + [
            Result(
                "CUDA process owner",
                OK if info and info.user == getpass.getuser() else FAIL,
                f"{info.user if info else '?'} (selftest runs as {getpass.getuser()})",
            )
        ]
    finally:
        child.kill()
        child.wait()


def _mig() -> list[Result]:
    from collectors.nvml import NvmlCollector

    collector = NvmlCollector()
    try:
        if not any(g.mig_mode == 1 for g in collector.static):
            return [Result("MIG devices", SKIPPED, "no GPU here is in MIG mode")]
        ours = [m.uuid for m in collector.mig_static()]
    finally:
        collector.close()
    listing = subprocess.run(
        [shutil.which("nvidia-smi") or "nvidia-smi", "-L"], capture_output=True, text=True, timeout=30
    ).stdout
    return [mig_verdict(ours, mig_devices_from_list(listing))]

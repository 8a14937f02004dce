"""The CUDA side of `gpuwatch selftest`, run as its own process: `python -m gpuwatch.selftest.probe`.

A child process, so that selftest has a CUDA process of its own for nvidia-smi to list, torch stays
out of the CLI, and a real OOM cannot hurt the caller. It measures and prints plain values, one JSON
object a line (`{"probe": name, ...}`); compare.py judges them. Its runs go to the database named
by GPUWATCH_DB, which the parent sets to a scratch file.

Between "process" and the rest it waits for one line on stdin: the parent samples NVML and
nvidia-smi while the process holds its known allocation.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import time

HOLD_BYTES = 1024 ** 3
BATCH, HEADS, HEAD_DIM = 1, 16, 64


def emit(name: str, **values) -> None:
    print(json.dumps({"probe": name, **values}), flush=True)


def _rows(sql: str, *args) -> list[tuple]:
    conn = sqlite3.connect(os.environ["GPUWATCH_DB"])
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def process(torch, gpuwatch) -> None:
    held = torch.empty(HOLD_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with gpuwatch.track(name="selftest-process") as run:
        device = torch.cuda.current_device()
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)  # torch >= 2.2
        emit("process", pid=os.getpid(), run_id=run.run_id, held_bytes=HOLD_BYTES, device=device,
             uuid=f"GPU-{uuid}" if uuid is not None else None)
        sys.stdin.readline()
    del held
    torch.cuda.empty_cache()


def memory_stats(torch) -> None:
    from gpuwatch.client.torch_stats import STORED_STATS_KEYS

    emit("memory_stats", keys=sorted(torch.cuda.memory_stats()), stored=list(STORED_STATS_KEYS))


def _work(torch, a, b, k: int):
    for _ in range(k):
        a = torch.tanh(a @ b)
    return a


def step_timing(torch, gpuwatch, steps: int) -> None:
    # 8192² bf16 matmuls: ~10 ms a step on an H100, so the µs a step() call costs are far below 2 %.
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
    _work(torch, a, b, 20)  # warm-up: cuBLAS handles, clocks up
    torch.cuda.synchronize()

    def loop(run, strict: bool = False) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if strict:  # any synchronising call inside step() raises; our own syncs stay outside
            torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(steps):
                _work(torch, a, b, 8)
                if run is not None:
                    run.step(tokens=1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    untracked = loop(None)
    sync_errors = 0
    with gpuwatch.track(name="selftest-nosync") as run:
        try:
            tracked = loop(run, strict=True)
        except RuntimeError as e:
            sync_errors, tracked = 1, float("nan")
            emit("sync_error", error=str(e).splitlines()[0])
    untracked = min(untracked, loop(None))  # bracket the tracked loop: clocks may drift

    wall = []
    with gpuwatch.track(name="selftest-steps") as run:
        run.step(tokens=1)  # step 1 is timed from the run's start; compare the steps after it
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _work(torch, a, b, 8)
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1000)
            run.step(tokens=1)
        run_id = run.run_id
    events = [ms for (ms,) in _rows("SELECT step_time_ms FROM steps WHERE run_id = ? AND step > 1 "
                                    "ORDER BY step", run_id)]
    emit("step_timing", event_ms=events, wall_ms=wall, tracked_s=tracked, untracked_s=untracked,
         sync_errors=sync_errors)


def profiler(torch, gpuwatch) -> None:
    a = torch.randn(2048, 2048, device="cuda")
    with gpuwatch.track(name="selftest-profile") as run:
        run._profiling.request(3)
        for _ in range(10):
            _work(torch, a, a / 64, 4)
            run.step(tokens=1)
        run_id = run.run_id
    ops = _rows("SELECT o.name, o.device_total_us FROM profile_ops o JOIN profiles p ON p.id = o.profile_id "
                "WHERE p.run_id = ?", run_id)
    emit("profiler", ops=[{"name": n, "device_total_us": d} for n, d in ops])


def oom(torch, gpuwatch) -> None:
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    from gpuwatch.selftest.compare import attention_oom_length

    dtype_bytes = 2
    seq_len = attention_oom_length(free, BATCH, HEADS, dtype_bytes)
    config = {"attn": "naive", "batch": BATCH, "heads": HEADS, "seq_len": seq_len, "precision": "bf16"}
    run_id = None
    try:
        with gpuwatch.track(name="selftest-oom", config=config) as run:
            run_id = run.run_id
            forward(torch, seq_len)
    except torch.cuda.OutOfMemoryError:
        pass
    free_now, _ = torch.cuda.mem_get_info()
    reserved_now = torch.cuda.memory_reserved()
    rows = _rows("SELECT requested_bytes, free_bytes, reserved_bytes, phase, advice_json FROM oom_postmortems "
                 "WHERE run_id = ?", run_id)
    pm = dict(zip(("requested_bytes", "free_bytes", "reserved_bytes", "phase", "advice"), rows[0])) if rows else {}
    pm["advice"] = json.loads(pm.get("advice") or "[]")
    emit("oom", postmortem=pm, batch=BATCH, heads=HEADS, seq_len=seq_len, dtype_bytes=dtype_bytes,
         free_now=free_now, reserved_now=reserved_now)
    from gpuwatch.selftest.compare import advised_length

    fits = advised_length(pm["advice"])
    if fits:
        torch.cuda.empty_cache()
        try:
            forward(torch, fits)
            torch.cuda.synchronize()
            emit("oom_fits", seq_len=fits, fits=True)
        except torch.cuda.OutOfMemoryError as e:
            emit("oom_fits", seq_len=fits, fits=False, error=str(e).splitlines()[0])


def forward(torch, seq_len: int):
    """Naive attention scores, B·H·L² bf16: the tensor that does not fit."""
    q = torch.randn(BATCH, HEADS, seq_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    scores = q @ q.transpose(-2, -1)
    return scores.sum()


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    try:
        import torch
    except ImportError as e:
        emit("error", error=f"torch is not importable: {e}")
        return
    if not torch.cuda.is_available():
        emit("error", error=f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)")
        return
    import gpuwatch

    emit("torch", version=torch.__version__, cuda=torch.version.cuda, device=torch.cuda.get_device_name())
    for name, fn in (("process", lambda: process(torch, gpuwatch)),
                     ("memory_stats", lambda: memory_stats(torch)),
                     ("step_timing", lambda: step_timing(torch, gpuwatch, 20 if quick else 100)),
                     ("profiler", lambda: profiler(torch, gpuwatch)),
                     ("oom", lambda: oom(torch, gpuwatch))):
        try:
            fn()
        except Exception as e:  # one broken probe must not hide the others' results
            emit("failed", name=name, error=f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""What an OOM postmortem costs the dying process: capture time and extra memory.

Host path: a real CPU allocator failure (this process under an RLIMIT_AS just above its current
address space), then the same capture the client runs. GPU path: the same capture code fed a
fake allocator state (simulated) with a large recorded history, snapshot pickle written.
Goals: <= 2 s and <= 64 MB per capture. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_postmortem.py
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import psutil  # noqa: E402

from gpuwatch.client import oom  # noqa: E402

GiB = 1 << 30
HISTORY_BLOCKS = 20_000  # live blocks in the fake snapshot, each with a 12-frame stack


def measure(label: str, capture) -> None:
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    tracemalloc.start()
    started = time.perf_counter()
    fields = capture()
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_after = proc.memory_info().rss
    print(
        f"{label:<44} {seconds * 1000:8.1f} ms   python peak {peak / 2**20:6.1f} MiB   "
        f"RSS +{max(rss_after - rss_before, 0) / 2**20:6.1f} MiB   advice items {len(fields['advice'])}"
    )


def host_case() -> None:
    import torch

    vms = psutil.Process().memory_info().vms
    limit = vms + GiB
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    try:
        torch.empty(4 * GiB, dtype=torch.uint8)
    except RuntimeError as e:
        error = e
    else:
        raise SystemExit("expected the CPU allocator to fail under RLIMIT_AS")
    config = {"attn": "naive", "batch": 4, "heads": 4, "seq_len": 8192, "precision": "fp32"}
    measure(
        "host OOM (real allocator failure)",
        lambda: oom.postmortem(error, run_dir=None, step=1, seq_len=8192, batch=4, config=config),
    )
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def fake_cuda():
    frames = [{"filename": f"/work/model_{i}.py", "line": i, "name": f"fn_{i}"} for i in range(12)]
    blocks = [
        {"size": (i % 97 + 1) << 20, "state": "active_allocated", "frames": [dict(f) for f in frames]}
        for i in range(HISTORY_BLOCKS)
    ]
    snapshot = {
        "segments": [{"blocks": blocks[i : i + 100]} for i in range(0, len(blocks), 100)],
        "device_traces": [[]],
    }
    stats = {"allocated_bytes.all.current": 60 * GiB, "reserved_bytes.all.current": 76 * GiB}
    return SimpleNamespace(
        current_device=lambda: 0,
        mem_get_info=lambda d: (GiB, 80 * GiB),
        memory_stats=lambda d: stats,
        memory_summary=lambda d: "summary (simulated)\n" * 200,
        memory=SimpleNamespace(_snapshot=lambda: snapshot),
    )


def gpu_case() -> None:
    import fake_pynvml

    cuda = fake_cuda()
    nvml = fake_pynvml.FakeNvml(gpus=8, procs_per_gpu=3)
    try:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
    except RuntimeError as e:
        error = e
    with tempfile.TemporaryDirectory() as run_dir:
        measure(
            f"GPU OOM (simulated, {HISTORY_BLOCKS} blocks, 8 GPUs)",
            lambda: oom.postmortem(
                error,
                run_dir=Path(run_dir),
                step=7,
                seq_len=4096,
                batch=2,
                config={"precision": "bf16"},
                cuda=cuda,
                nvml=nvml,
            ),
        )
        size = os.path.getsize(Path(run_dir) / oom.SNAPSHOT_NAME)
        print(f"{'':<44} snapshot pickle {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    print("postmortem capture cost (goals: <= 2000 ms, <= 64 MiB)")
    gpu_case()
    host_case()

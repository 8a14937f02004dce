"""Kineto-format traces written from scratch, for the trace analysis tests and bench_trace.py.

A simulated training loop: per ProfilerStep, a data loader `__next__`, a host-to-device copy,
forward/backward kernels launched from cudaLaunchKernel runtime events (correlation ids, ac2g
flow events), NCCL all-reduce kernels on a second stream, a memset, an optimizer step and,
optionally, a `.item()` that synchronises. The GPU side is simulated from the CPU side: a kernel
starts when both its launch has reached the GPU and its stream is free, so idle time, host
wait and overlap come out of the schedule rather than being written in.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

CPU_TID, GPU_PID = 11, 0
COMPUTE_STREAM, COMM_STREAM, COPY_STREAM = 7, 20, 24
_LAUNCH_LATENCY = 4.0

KERNELS = [  # (name, mean µs)
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", 180.0),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", 140.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", 30.0),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", 25.0),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", 20.0),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", 12.0),
]
FLASH = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4>>", 150.0)
MATH_SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", 90.0)
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


class _Writer:
    def __init__(self, rank: int, seed: int):
        self.events: list[dict] = []
        self.rng = random.Random(seed * 1000 + rank)
        self.pid = 4000 + rank
        self.corr = 100_000  # real ids run high; HTA (pandas 3) breaks on int16-sized ones
        self.ext = 1
        self.free = {COMPUTE_STREAM: 0.0, COMM_STREAM: 0.0, COPY_STREAM: 0.0}

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op", **args) -> None:
        self.ext += 1
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.pid,
                "tid": CPU_TID,
                "ts": round(ts, 3),
                "dur": round(dur, 3),
                "args": {"External id": self.ext, **args},
            }
        )

    def launch(
        self,
        t: float,
        name: str,
        mean: float,
        stream: int,
        cat: str = "kernel",
        api: str = "cudaLaunchKernel",
        jitter: float = 0.15,
        after: float = 0.0,
    ) -> float:
        """A runtime call at CPU time t and its GPU event; returns the CPU time after the call."""
        self.corr += 1
        api_dur = 3.0 + self.rng.random() * 2
        self.cpu(api, t, api_dur, cat="cuda_runtime", correlation=self.corr)
        start = max(t + _LAUNCH_LATENCY, self.free[stream], after)
        dur = max(1.0, self.rng.gauss(mean, mean * jitter))
        self.free[stream] = start + dur
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": GPU_PID,
                "tid": stream,
                "ts": round(start, 3),
                "dur": round(dur, 3),
                "args": {"device": 0, "stream": stream, "correlation": self.corr, "External id": self.ext},
            }
        )
        for ph, ts, pid, tid in (("s", t, self.pid, CPU_TID), ("f", start, GPU_PID, stream)):
            self.events.append(
                {
                    "ph": ph,
                    "id": self.corr,
                    "pid": pid,
                    "tid": tid,
                    "ts": round(ts, 3),
                    "cat": "ac2g",
                    "name": "ac2g",
                    **({"bp": "e"} if ph == "f" else {}),
                }
            )
        return t + api_dur


def make_trace(
    rank: int = 0,
    world: int = 1,
    steps: int = 4,
    seed: int = 0,
    layers: int = 6,
    loader_us: float = 400.0,
    cpu_gap_us: float = 6.0,
    nccl: bool = True,
    sync: bool = True,
    attention: str = "flash",
    htod_us: float = 60.0,
    slow: float = 1.0,
    distributed_info: bool = True,
) -> dict:
    """One rank's trace as a dict: `steps` ProfilerSteps of `layers` layers each.

    `loader_us`: time in the data loader per step; `cpu_gap_us`: CPU time between launches
    (large makes the run launch-bound); `slow` scales this rank's kernel times (a straggler).
    """
    w = _Writer(rank, seed)
    t = 1_000_000.0 + w.rng.random() * 10
    for n in range(steps):
        step_start = t
        body: list[dict] = []
        w.events, saved = body, w.events
        w.cpu(
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, loader_us, cat="user_annotation"
        )
        t += loader_us + 2
        w.cpu("aten::to", t, 10 + htod_us / 10)
        t = (
            w.launch(
                t + 1,
                "Memcpy HtoD (Pageable -> Device)",
                htod_us,
                COMPUTE_STREAM,
                cat="gpu_memcpy",
                api="cudaMemcpyAsync",
            )
            + 2
        )
        for phase in ("forward", "backward"):
            scale = 1.0 if phase == "forward" else 2.0
            for layer in range(layers):
                op_start = t
                for name, mean in KERNELS:
                    t = (
                        w.launch(t + cpu_gap_us * w.rng.random(), name, mean * scale * slow, COMPUTE_STREAM)
                        + 1
                    )
                if attention == "flash":
                    t = w.launch(t + cpu_gap_us, FLASH[0], FLASH[1] * scale * slow, COMPUTE_STREAM) + 1
                elif attention == "math":
                    m0 = t
                    t = w.launch(t + 1, KERNELS[0][0], 200 * scale * slow, COMPUTE_STREAM) + 1
                    t = w.launch(t + 1, MATH_SOFTMAX[0], MATH_SOFTMAX[1] * slow, COMPUTE_STREAM) + 1
                    t = w.launch(t + 1, KERNELS[0][0], 200 * scale * slow, COMPUTE_STREAM) + 1
                    w.cpu("aten::_scaled_dot_product_attention_math", m0, t - m0)
                w.cpu("aten::linear" if layer % 2 else "aten::layer_norm", op_start, t - op_start)
                if phase == "backward" and nccl and world > 1:
                    # all-reduce of this layer's gradients, overlapping the next layer's compute
                    t = w.launch(t + 1, NCCL, 220.0, COMM_STREAM, after=w.free[COMPUTE_STREAM]) + 1
        t = w.launch(t + 2, "Memset (Device)", 3.0, COMPUTE_STREAM, cat="gpu_memset") + 1
        opt_start = t
        for _ in range(4):
            t = (
                w.launch(
                    t + cpu_gap_us,
                    "void at::native::(anonymous namespace)::"
                    "multi_tensor_apply_kernel<at::native::FusedAdamMathFunctor>",
                    35.0,
                    COMPUTE_STREAM,
                )
                + 1
            )
        w.cpu("Optimizer.step#AdamW.step", opt_start, t - opt_start, cat="user_annotation")
        if sync:
            sync_start = t
            end = max(w.free.values())
            w.cpu("aten::item", sync_start, max(end - sync_start, 0) + 8)
            w.cpu(
                "cudaStreamSynchronize",
                sync_start + 2,
                max(end - sync_start, 0) + 4,
                cat="cuda_runtime",
                correlation=-1,
            )
            t = max(t, end) + 10
        w.events = saved
        w.cpu(f"ProfilerStep#{n}", step_start, t - step_start, cat="user_annotation")
        w.events.append(
            {
                "ph": "X",
                "cat": "gpu_user_annotation",
                "name": f"ProfilerStep#{n}",
                "pid": GPU_PID,
                "tid": COMPUTE_STREAM,
                "ts": round(step_start + 6, 3),
                "dur": round(t - step_start, 3),
                "args": {"External id": w.ext},
            }
        )
        w.events.extend(body)
        t += 5
    meta = [
        {"name": "process_name", "ph": "M", "pid": w.pid, "args": {"name": "python"}},
        {"name": "thread_name", "ph": "M", "pid": w.pid, "tid": CPU_TID, "args": {"name": "python"}},
    ]
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3 (simulated)"}]}
    if distributed_info:
        trace["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    trace["traceEvents"] = meta + w.events
    trace["traceName"] = f"rank{rank}.json"
    return trace


def write_trace(path: Path, trace: dict) -> Path:
    path = Path(path)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            json.dump(trace, fh)
    else:
        path.write_text(json.dumps(trace))
    return path

"""Advice lines computed from a trace breakdown, each naming the figures it rests on.

Like the OOM postmortem's advice (gpuwatch/client/oom_advice.py): a line is given only when its
numbers say so, and it says the numbers. Thresholds are shares of the analysed GPU time.
"""

from __future__ import annotations

_IDLE = 10.0  # % of GPU kernel time idle before the idle's cause is worth a line
_CAUSE = 50.0  # % of that idle one cause must hold to be named
_SYNC_CAUSE = 30.0  # synchronise calls are cheap to remove, so name them sooner
_HTOD = 5.0  # % of GPU time in host-to-device copies
_COMM = 10.0  # % of GPU time in NCCL
_OVERLAP = 50.0  # % of NCCL time overlapped by compute, below which overlap is poor
_STRAGGLER = 10.0  # % more compute than the median rank
_ELEMENTWISE = 30.0
_CPU_LOADER = 20.0
_CPU_OPTIM = 30.0


def advise(result: dict) -> list[str]:
    """Advice for a whole `analyse_files` result; a rank is named when there are several."""
    lines: list[str] = []
    many = len(result["ranks"]) > 1
    for r in result["ranks"]:
        who = f"rank {r['rank']}: " if many else ""
        items = _gpu(r) if r.get("temporal") else _cpu(r)
        lines += [who + line for line in items if line not in lines]
    slow = result.get("slowest")
    if slow and slow["slower_pct"] is not None and slow["slower_pct"] >= _STRAGGLER:
        lines.append(
            f"rank {slow['rank']} computes {slow['slower_pct']:.0f} % longer than the "
            f"median rank, and the others wait for it in the collectives: check its GPU "
            f"(clocks, temperature, neighbours) and the size of its data shard"
        )
    return lines


def _gpu(r: dict) -> list[str]:
    t, idle, out = r["temporal"], r["idle"], []
    idle_pct = t["idle_pct"] or 0.0
    if idle_pct >= _IDLE and idle["idle_us"]:
        if (idle["dataloader_pct"] or 0) >= _CAUSE:
            out.append(
                f"GPU idle {idle_pct:.0f} % of the time, {idle['dataloader_pct']:.0f} % of "
                f"it waiting for the data loader: more DataLoader workers (num_workers), "
                f"pin_memory=True, persistent_workers=True"
            )
        elif (idle["sync_pct"] or 0) >= _SYNC_CAUSE:
            out.append(
                f"GPU idle {idle_pct:.0f} % of the time, {idle['sync_pct']:.0f} % of it "
                f"in synchronise calls (cudaStreamSynchronize/cudaDeviceSynchronize, "
                f".item()): log losses every N steps, keep tensors on the GPU"
            )
        elif (idle["host_wait_pct"] or 0) >= _CAUSE:
            out.append(
                f"GPU idle {idle_pct:.0f} % of the time, {idle['host_wait_pct']:.0f} % of "
                f"it waiting for the CPU to launch kernels (launch-bound): CUDA graphs or "
                f"torch.compile(mode='reduce-overhead'), a larger batch, fewer small ops"
            )
    groups = {g["group"]: g for g in r["kernel_groups"]}
    math = groups.get("attention (math)")
    if math and math["total_us"] > 0:
        out.append(
            f"attention runs the math kernel, not flash: {math['share_pct']:.0f} % of GPU "
            f"time; SDPA picks flash/memory-efficient with fp16/bf16 inputs, a head "
            f"dimension ≤ 256 and no arbitrary attention mask"
        )
    htod = r.get("memcpy_us", {}).get("HtoD", 0.0)
    if t["kernel_time_us"] and 100 * htod / t["kernel_time_us"] >= _HTOD:
        out.append(
            f"HtoD copies {100 * htod / t['kernel_time_us']:.0f} % of GPU time: "
            f"pin_memory=True in the DataLoader and .to(device, non_blocking=True)"
        )
    nccl = groups.get("nccl")
    if nccl and (nccl["share_pct"] or 0) >= _COMM and (r["overlap_pct"] or 0) < _OVERLAP:
        out.append(
            f"NCCL {nccl['share_pct']:.0f} % of GPU time, only "
            f"{r['overlap_pct'] or 0:.0f} % of it overlapped with compute: tune DDP's "
            f"bucket_cap_mb, accumulate gradients under no_sync(), FSDP prefetch"
        )
    ew = groups.get("elementwise")
    if ew and (ew["share_pct"] or 0) >= _ELEMENTWISE:
        out.append(f"elementwise kernels {ew['share_pct']:.0f} % of GPU time: torch.compile fuses them")
    return out


def _cpu(r: dict) -> list[str]:
    c, out = r.get("cpu"), []
    if not c:
        return out
    if (c["dataloader_pct"] or 0) >= _CPU_LOADER:
        out.append(
            f"data loader {c['dataloader_pct']:.0f} % of each step on the CPU: more "
            f"DataLoader workers (num_workers), prefetch_factor, cheaper transforms"
        )
    if (c["optimizer_pct"] or 0) >= _CPU_OPTIM:
        out.append(
            f"optimizer {c['optimizer_pct']:.0f} % of each step: a foreach/fused "
            f"optimizer (foreach=True, fused=True)"
        )
    return out

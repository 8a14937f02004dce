"""What to try after an OOM, worked out from the postmortem's numbers and the run's config.

Every item states the figures it rests on; an item whose figures are missing is not given.
Inputs are plain dicts (postmortem fields as captured or as stored), so the CLI, the TUI and the
client all get the same advice.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from gpuwatch.base.fmt import size
from gpuwatch.store.postmortems import headroom_bytes

# Bytes per element of activations under each run precision (autocast keeps matmul outputs in it).
_DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
# Weights + gradients + AdamW's two moments, fp32: what a parameter costs before activations.
_TRAIN_BYTES_PER_PARAM = 16
_FRAGMENTED_SHARE = 0.2  # reserved-but-unallocated above this share of reserved is fragmentation
_NEIGHBOUR_SHARE = 0.1  # a neighbour holding this share of the GPU is worth naming


@dataclass(frozen=True)
class Advice:
    title: str
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def advise(pm: dict[str, Any], config: dict[str, Any]) -> list[Advice]:
    """Advice for one postmortem `pm` (captured fields or a stored row) of a run with `config`."""
    items = [
        _attention(pm, config),
        _fragmentation(pm),
        _neighbour(pm),
        _precision(pm, config),
        _checkpointing(pm, config),
        *_host(pm, config),
    ]
    return [a for a in items if a is not None]


def _attention(pm: dict[str, Any], config: dict[str, Any]) -> Advice | None:
    batch = pm.get("batch") or config.get("batch")
    seq_len = pm.get("seq_len") or config.get("seq_len")
    heads = config.get("heads")
    dtype_bytes = _DTYPE_BYTES.get(str(config.get("precision", config.get("dtype", "fp32"))), 4)
    if config.get("attn") != "naive" or not (batch and seq_len and heads):
        return None
    scores = batch * heads * seq_len * seq_len * dtype_bytes
    detail = (
        f"naive attention needs {size(scores)} for the B·H·L² score tensor at L={seq_len} "
        f"(B={batch}, H={heads}, {dtype_bytes} bytes each), per layer; "
        f"SDPA/FlashAttention avoids materialising it"
    )
    room = headroom_bytes(pm)
    if room:
        fits = math.isqrt(room // (batch * heads * dtype_bytes))
        detail += f"; or L ≤ {fits} fits the {size(room)} that was free"
    return Advice("Attention scores are B·H·L²", detail)


def _fragmentation(pm: dict[str, Any]) -> Advice | None:
    reserved, allocated = pm.get("reserved_bytes"), pm.get("allocated_bytes")
    if pm.get("oom_kind", pm.get("kind")) != "gpu" or reserved is None or allocated is None:
        return None
    cached = reserved - allocated
    requested = pm.get("requested_bytes") or 0
    if cached <= 0 or (cached < requested and cached < _FRAGMENTED_SHARE * reserved):
        return None
    return Advice(
        "Fragmented allocator cache",
        f"{size(cached)} reserved but unallocated ({size(reserved)} reserved, {size(allocated)} "
        f"allocated) while {size(requested)} was requested; "
        f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets segments grow instead",
    )


def _neighbour(pm: dict[str, Any]) -> Advice | None:
    others = pm.get("neighbours") or []
    total = pm.get("total_bytes")
    used = sum(n.get("used_mem_bytes") or 0 for n in others)
    if not others or not total or used < _NEIGHBOUR_SHARE * total:
        return None
    top = max(others, key=lambda n: n.get("used_mem_bytes") or 0)
    detail = (
        f"{len(others)} other process(es) hold {size(used)} of this GPU's {size(total)}; "
        f"largest: pid {top.get('pid')} ({top.get('user') or '?'}) with {size(top.get('used_mem_bytes'))}"
    )
    need = (pm.get("allocated_bytes") or 0) + (pm.get("requested_bytes") or 0)
    free = (pm.get("stats") or {}).get("gpu_free_bytes") or {}
    roomy = sorted(
        ((int(i), f) for i, f in free.items() if f >= need and int(i) != pm.get("device")),
        key=lambda x: -x[1],
    )
    if roomy:
        detail += (
            "; room for this run's "
            + size(need)
            + " on "
            + ", ".join(f"GPU {i} ({size(f)} free)" for i, f in roomy[:3])
        )
    return Advice("Another process holds memory on this GPU", detail)


def _precision(pm: dict[str, Any], config: dict[str, Any]) -> Advice | None:
    requested = pm.get("requested_bytes")
    if str(config.get("precision", "")) not in ("fp32", "float32") or not requested:
        return None
    return Advice(
        "Activations are fp32",
        f"bf16 autocast keeps activations in 2 bytes instead of 4: this {size(requested)} "
        f"request would be {size(requested // 2)}, and the activations held so far halve too",
    )


def _checkpointing(pm: dict[str, Any], config: dict[str, Any]) -> Advice | None:
    n_params = config.get("n_params")
    allocated = pm.get("allocated_bytes")
    if not n_params or not allocated or config.get("checkpointing"):
        return None
    state = n_params * _TRAIN_BYTES_PER_PARAM
    if allocated < 2 * state:
        return None
    return Advice(
        "Activations dominate",
        f"{size(allocated)} allocated at the OOM vs {size(state)} for parameters, gradients and "
        f"AdamW state ({n_params:,} params × {_TRAIN_BYTES_PER_PARAM} B); gradient checkpointing "
        f"trades recompute for most of the other {size(allocated - state)}",
    )


def _host(pm: dict[str, Any], config: dict[str, Any]) -> list[Advice]:
    if pm.get("oom_kind", pm.get("kind")) != "host":
        return []
    items = []
    rss, requested = pm.get("rss_bytes"), pm.get("requested_bytes")
    limit = pm.get("cgroup_limit_bytes")
    if limit and rss is not None:
        items.append(
            Advice(
                "cgroup memory limit",
                f"RSS {size(rss)} of the {size(limit)} cgroup limit; the request for "
                f"{size(requested)} needed {size(max(rss + (requested or 0) - limit, 0))} more "
                f"than the limit allows",
            )
        )
    rlimit = (pm.get("stats") or {}).get("rlimit_as_bytes")
    if rlimit and requested:
        items.append(
            Advice(
                "Address-space limit (ulimit -v)",
                f"RLIMIT_AS is {size(rlimit)}; the request alone was {size(requested)} "
                f"({requested / rlimit:.0%} of it)",
            )
        )
    batch = pm.get("batch") or config.get("batch")
    if batch and batch > 1 and requested:
        items.append(
            Advice(
                "Smaller batch",
                f"batch {batch} -> {batch // 2} roughly halves per-step activations "
                f"(this request: {size(requested)} -> about {size(requested // 2)})",
            )
        )
    workers = config.get("num_workers")
    if workers and rss:
        items.append(
            Advice(
                "Fewer DataLoader workers",
                f"{workers} workers each hold a copy of the dataset state next to this "
                f"process's {size(rss)} RSS; try num_workers={max(workers // 2, 0)}",
            )
        )
    return items

"""Advice computed from a postmortem's numbers: each item's figures checked, absent when unfounded."""

from __future__ import annotations

import math
import re

from gpuwatch.client.oom_advice import advise
from gpuwatch.store.postmortems import headroom_bytes

GiB = 1 << 30
MiB = 1 << 20


def titles(items) -> list[str]:
    return [a.title for a in items]


def detail(items, title: str) -> str:
    return next(a.detail for a in items if a.title == title)


def gpu_pm(**over) -> dict:
    pm = {
        "oom_kind": "gpu",
        "device": 0,
        "requested_bytes": 16 * GiB,
        "free_bytes": 6 * GiB,
        "total_bytes": 80 * GiB,
        "allocated_bytes": 70 * GiB,
        "reserved_bytes": 72 * GiB,
    }
    pm.update(over)
    return pm


def test_naive_attention_scores_and_the_longest_fitting_length():
    config = {"attn": "naive", "batch": 8, "heads": 16, "seq_len": 8192, "precision": "bf16"}
    text = detail(advise(gpu_pm(), config), "Attention scores are B·H·L²")
    # 8·16·8192²·2 bytes = 16 GiB; with 6 GiB free, L² ≤ 6 GiB / (8·16·2)
    assert "needs 16.0 GiB" in text and "L=8192" in text
    fits = int(re.search(r"L ≤ (\d+) fits", text).group(1))
    assert fits * fits * 8 * 16 * 2 <= 6 * GiB < (fits + 1) ** 2 * 8 * 16 * 2
    assert fits == math.isqrt(6 * GiB // 256)


def test_no_attention_advice_for_sdpa():
    config = {"attn": "sdpa", "batch": 8, "heads": 16, "seq_len": 8192}
    assert "Attention scores are B·H·L²" not in titles(advise(gpu_pm(), config))


def test_fragmentation_only_when_the_cache_could_have_served_it():
    fragmented = advise(gpu_pm(allocated_bytes=50 * GiB, reserved_bytes=74 * GiB), {})
    assert "24.0 GiB reserved but unallocated" in detail(fragmented, "Fragmented allocator cache")
    tight = advise(gpu_pm(allocated_bytes=71 * GiB, reserved_bytes=72 * GiB), {})
    assert "Fragmented allocator cache" not in titles(tight)


def test_a_large_neighbour_names_the_gpu_with_room():
    pm = gpu_pm(
        neighbours=[
            {"pid": 4242, "user": "bob", "used_mem_bytes": 40 * GiB},
            {"pid": 17, "user": "eve", "used_mem_bytes": 1 * GiB},
        ],
        stats={"gpu_free_bytes": {"0": 6 * GiB, "1": 10 * GiB, "2": 90 * GiB, "3": 87 * GiB}},
    )
    text = detail(advise(pm, {}), "Another process holds memory on this GPU")
    assert "2 other process(es) hold 41.0 GiB" in text and "pid 4242 (bob) with 40.0 GiB" in text
    # needs allocated + requested = 86 GiB: GPUs 2 and 3 have it, 1 does not
    assert "GPU 2 (90.0 GiB free), GPU 3 (87.0 GiB free)" in text and "GPU 1" not in text


def test_small_neighbours_are_not_blamed():
    pm = gpu_pm(neighbours=[{"pid": 17, "user": "eve", "used_mem_bytes": 500 * MiB}])
    assert "Another process holds memory on this GPU" not in titles(advise(pm, {}))


def test_fp32_halves_with_bf16():
    text = detail(advise(gpu_pm(), {"precision": "fp32"}), "Activations are fp32")
    assert "16.0 GiB request would be 8.0 GiB" in text
    assert "Activations are fp32" not in titles(advise(gpu_pm(), {"precision": "bf16"}))


def test_activations_dominating_suggests_checkpointing_unless_on():
    config = {"n_params": 1_000_000_000}  # 16 GB of weights, grads and AdamW state
    text = detail(advise(gpu_pm(), config), "Activations dominate")
    assert "70.0 GiB allocated" in text and "14.9 GiB for parameters" in text
    assert "Activations dominate" not in titles(advise(gpu_pm(), {**config, "checkpointing": True}))
    assert "Activations dominate" not in titles(advise(gpu_pm(allocated_bytes=20 * GiB), config))


def test_host_advice_against_the_cgroup_limit():
    pm = {
        "oom_kind": "host",
        "requested_bytes": 2 * GiB,
        "rss_bytes": 7 * GiB,
        "available_bytes": 50 * GiB,
        "cgroup_limit_bytes": 8 * GiB,
        "batch": 32,
    }
    items = advise(pm, {"num_workers": 8})
    assert "RSS 7.0 GiB of the 8.0 GiB cgroup limit" in detail(items, "cgroup memory limit")
    assert "needed 1.0 GiB more" in detail(items, "cgroup memory limit")
    assert "batch 32 -> 16" in detail(items, "Smaller batch")
    assert "num_workers=4" in detail(items, "Fewer DataLoader workers")
    assert headroom_bytes(pm) == 1 * GiB  # the cgroup binds, not the host's 50 GiB


def test_rlimit_headroom_counts_address_space_not_rss():
    pm = {
        "oom_kind": "host",
        "rss_bytes": 300 * MiB,
        "available_bytes": 50 * GiB,
        "stats": {"rlimit_as_bytes": 3 * GiB, "vms_bytes": 2 * GiB},
    }
    assert headroom_bytes(pm) == 1 * GiB


def test_stored_rows_use_kind_and_get_the_same_advice():
    captured = gpu_pm(allocated_bytes=50 * GiB, reserved_bytes=74 * GiB)
    stored = {("kind" if k == "oom_kind" else k): v for k, v in captured.items()}
    assert advise(stored, {}) == advise(captured, {})

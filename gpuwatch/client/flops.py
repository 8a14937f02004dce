"""Model FLOPs per token, peak GPU FLOPS by GPU name, and MFU.

Peak figures are dense (no 2:4 sparsity) tensor-core throughput from NVIDIA's datasheets;
"fp32" is the plain (non-tensor-core) FP32 rate. MFU is achieved model FLOPs / that peak, the
definition of PaLM (Chowdhery et al. 2022, appendix B).
"""

from __future__ import annotations

import re

TERA = 1e12

# (regex on the upper-cased NVML/torch device name, {dtype: peak FLOP/s}); first match wins,
# so specific variants (H100 PCIe/NVL) come before their family.
_PEAKS: list[tuple[str, dict[str, float]]] = [
    (r"\bB200\b", {"bf16": 2250, "fp16": 2250, "tf32": 1100, "fp32": 80}),
    (r"\bH200\b.*\bNVL\b", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60}),
    (r"\bH200\b", {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67}),
    (r"\bH100\b.*\bPCIE\b", {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51}),
    (r"\bH100\b.*\bNVL\b", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60}),
    (r"\bH100\b", {"bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67}),  # SXM
    (r"\bA100\b", {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5}),
    (r"\bL40S\b", {"bf16": 362, "fp16": 362, "tf32": 183, "fp32": 91.6}),
    (r"\bL40\b", {"bf16": 181, "fp16": 181, "tf32": 90.5, "fp32": 90.5}),
    (r"\bL4\b", {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3}),
    (r"\bA10\b", {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2}),
    (r"\bRTX 6000 ADA\b", {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1}),
    (r"\bRTX A6000\b", {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7}),
    (r"\bRTX 4090\b", {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6}),
    (r"\bRTX 3090\b", {"bf16": 71, "fp16": 71, "tf32": 35.6, "fp32": 35.6}),
    # Volta and Turing have no bf16 tensor cores: only fp16 and fp32 are listed.
    (r"\bV100\b.*\bPCIE\b", {"fp16": 112, "fp32": 14}),
    (r"\bV100\b", {"fp16": 125, "fp32": 15.7}),  # SXM2
    (r"\bT4\b", {"fp16": 65, "fp32": 8.1}),
]

_DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "tf32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
}


def normalize_dtype(dtype: object) -> str:
    """'bf16', 'bfloat16' or torch.bfloat16 -> 'bf16'; ValueError naming the dtype otherwise."""
    text = str(dtype).lower().removeprefix("torch.")
    try:
        return _DTYPE_ALIASES[text]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of bf16, fp16, tf32, fp32") from None


def peak_flops(gpu_name: str | None, dtype: object = "bf16") -> float | None:
    """Dense peak FLOP/s of one GPU for `dtype`, or None for an unknown GPU or unsupported dtype."""
    if not gpu_name:
        return None
    key = normalize_dtype(dtype)
    name = gpu_name.upper()
    for pattern, peaks in _PEAKS:
        if re.search(pattern, name):
            tflops = peaks.get(key)
            return tflops * TERA if tflops is not None else None
    return None


def transformer_flops_per_token(
    n_layers: int, d_model: int, seq_len: int, vocab: int, n_params: int | None = None, training: bool = True
) -> float:
    """Model FLOPs per token of a decoder-only transformer.

    PaLM appendix B (also nanoGPT's estimate_mfu): training costs 6·N + 12·L·d·T per token,
    where N = matmul parameters, L = layers, d = d_model (= heads × head dim), T = sequence length;
    the second term is attention's QK^T and AV matmuls (full, not halved for causal masking, as
    in PaLM). Forward-only (inference) is a third of that: 2·N + 4·L·d·T.
    With n_params None, N = 12·L·d² (attention + 4x MLP, Kaplan et al. 2020) + vocab·d (the
    output projection, which is a matmul per token even when tied to the embedding).
    """
    for label, value in (
        ("n_layers", n_layers),
        ("d_model", d_model),
        ("seq_len", seq_len),
        ("vocab", vocab),
    ):
        if value <= 0:
            raise ValueError(f"{label} must be > 0, got {value}")
    n = n_params if n_params is not None else 12 * n_layers * d_model**2 + vocab * d_model
    train = 6 * n + 12 * n_layers * d_model * seq_len
    return float(train if training else train / 3)


def mfu(tokens_per_s: float | None, flops_per_token: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation as a fraction of `peak`; None when any input is unknown."""
    if not tokens_per_s or not flops_per_token or not peak:
        return None
    return tokens_per_s * flops_per_token / peak

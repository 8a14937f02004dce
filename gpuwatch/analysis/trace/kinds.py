"""What a GPU event is: HTA's three kernel types, and the finer groups people recognise.

The types are HTA's (hta/utils/utils.py `get_kernel_type`) so the temporal breakdown matches
it: COMMUNICATION is an NCCL kernel, MEMORY a memcpy/memset, COMPUTATION anything else but
NCCL-side helper kernels (Memcpy/Memset/Sync inside the name), which HTA counts as neither.
"""

from __future__ import annotations

import re

COMMUNICATION, MEMORY, COMPUTATION, OTHER = "COMMUNICATION", "MEMORY", "COMPUTATION", "OTHER"

_NCCL = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def kernel_type(name: str) -> str:
    if _NCCL.match(name):
        return COMMUNICATION
    if _MEMORY.match(name):
        return MEMORY
    if not _NOT_COMPUTE.match(name):
        return COMPUTATION
    return OTHER


_FLASH = re.compile(
    r"flash|fmha|efficient_attention|attention_kernel|_sdpa|cudnn.*attn|attn_fwd"
    r"|attn_bwd",
    re.I,
)
_GEMM = re.compile(
    r"gemm|cutlass|cublas|xmma|matmul|_mma|wgmma|sm\d\d_|ampere_|volta_|turing_"
    r"|hopper_|Kernel2",
    re.I,
)
_REDUCTION = re.compile(r"reduce|softmax|norm|_sum_|argmax|cross_entropy|nll_loss|scan", re.I)
_ELEMENTWISE = re.compile(
    r"elementwise|vectorized|unrolled|pointwise|triton_poi|copy_kernel"
    r"|fill_kernel|index|cat_|gather|scatter|dropout|gelu|silu|relu",
    re.I,
)


def group(name: str, math_attention: bool = False) -> str:
    """The group a GPU event's name falls in; `math_attention` when launched under SDPA's math path."""
    if _NCCL.match(name) or name.startswith("nccl"):
        return "nccl"
    if name.startswith("Memcpy") or name.startswith("dma"):
        return "memcpy"
    if name.startswith("Memset"):
        return "memset"
    if math_attention:
        return "attention (math)"
    if _FLASH.search(name):
        return "attention (flash/SDPA)"
    if _GEMM.search(name):
        return "gemm"
    if _REDUCTION.search(name):
        return "reduction"
    if _ELEMENTWISE.search(name):
        return "elementwise"
    return "other"

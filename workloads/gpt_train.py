"""A GPT-style decoder trained on synthetic tokens: the long-sequence memory and speed workload.

    python -m workloads.gpt_train --tiny                       # seconds on a CPU
    python -m workloads.gpt_train --seq-len 8192 --batch 4 --attn sdpa --precision bf16 --checkpointing

`--attn naive` materialises the B*H*L*L score tensor (the articles' OOM case: 8*8192^2*4 bytes
per head and layer); `--attn sdpa` uses F.scaled_dot_product_attention (flash/memory-efficient
kernels where available). The last line is `GPUWATCH_RESULT {"peak_bytes": ..., "tokens_per_s": ...}`
for programs (capacity studies) that run this and parse what it measured.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from workloads import common

SIZES = {
    "seq_len": (int, 1024, 64, "tokens per sequence"),
    "batch": (int, 8, 4, "sequences per step"),
    "layers": (int, 12, 2, "decoder blocks"),
    "d_model": (int, 768, 64, "model width"),
    "heads": (int, 12, 4, "attention heads"),
    "vocab": (int, 50257, 512, "vocabulary size"),
    "steps": (int, 20, 10, "training steps"),
}


def causal_mask(q_len: int, kv_len: int, device) -> torch.Tensor:
    """True where query i (the last q_len of kv_len positions) may look at key j."""
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=kv_len - q_len)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn: str) -> torch.Tensor:
    q_len, kv_len = q.size(-2), k.size(-2)
    if attn == "sdpa":
        if q_len == kv_len:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if q_len == 1:  # one new token sees the whole cache
            return F.scaled_dot_product_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(q_len, kv_len, q.device))
    # naive: the full B*H*q_len*kv_len score tensor lives in memory (and is kept for backward).
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores.masked_fill(~causal_mask(q_len, kv_len, q.device), float("-inf"))
    return scores.softmax(dim=-1) @ v


class KVCache:
    """Keys and values of every layer, allocated once for the whole generation."""

    def __init__(
        self, n_layers: int, batch: int, heads: int, max_len: int, head_dim: int, device, dtype: torch.dtype
    ):
        shape = (n_layers, batch, heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions filled so far

    @property
    def nbytes(self) -> int:
        return self.k.nelement() * self.k.element_size() * 2

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.size(-2)
        if end > self.k.size(-2):
            raise ValueError(f"KV cache holds {self.k.size(-2)} positions; asked for {end}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, attn: str, layer: int):
        super().__init__()
        self.heads, self.attn, self.layer = heads, attn, layer
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2)
        )
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
            k, v = k.to(q.dtype), v.to(q.dtype)
        y = attend(q, k, v, self.attn)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int, attn: str, layer: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, attn, layer)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self,
        vocab: int,
        max_len: int,
        layers: int,
        d_model: int,
        heads: int,
        attn: str = "sdpa",
        checkpointing: bool = False,
    ):
        super().__init__()
        self.max_len, self.heads, self.checkpointing = max_len, heads, checkpointing
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)  # learned positions
        self.blocks = nn.ModuleList(Block(d_model, heads, attn, i) for i in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok_emb.weight  # tied, as in GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None) -> KVCache:
        d_model = self.tok_emb.embedding_dim
        p = self.tok_emb.weight
        return KVCache(
            len(self.blocks), batch, self.heads, max_len, d_model // self.heads, p.device, dtype or p.dtype
        )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        start = cache.length if cache is not None else 0
        if start + idx.size(1) > self.max_len:
            raise ValueError(
                f"sequence of {start + idx.size(1)} tokens exceeds the model's {self.max_len} positions"
            )
        pos = torch.arange(start, start + idx.size(1), device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            if self.checkpointing and self.training and cache is None:
                # Keep only block inputs; recompute activations in backward (less memory, ~30% more time).
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x, cache)
        if cache is not None:
            cache.length += idx.size(1)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def build_model(args: argparse.Namespace) -> GPT:
    """The model the flags describe, with weights drawn from --seed."""
    torch.manual_seed(args.seed)
    return GPT(
        args.vocab,
        args.seq_len,
        args.layers,
        args.d_model,
        args.heads,
        attn=args.attn,
        checkpointing=getattr(args, "checkpointing", False),
    )


def synthetic_batch(
    args: argparse.Namespace, generator: torch.Generator, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable synthetic language, so the loss visibly falls: each sequence counts from a
    random start by a stride of 1, 2 or 3 (mod vocab). Inputs, and the same sequence shifted by
    one as next-token targets."""
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=generator)
    stride = torch.randint(1, 4, (args.batch, 1), generator=generator)
    seq = (start + stride * torch.arange(args.seq_len + 1)) % args.vocab
    seq = seq.to(device, non_blocking=True)
    return seq[:, :-1], seq[:, 1:]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def matmul_params(model: nn.Module) -> int:
    """Weights used in a matmul per token (FLOPs count): every Linear, the tied output head included."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def train(args: argparse.Namespace) -> dict:
    """Train for --steps steps under gpuwatch.track; returns what the summary and result line show."""
    import gpuwatch
    from gpuwatch.client.flops import transformer_flops_per_token

    device = common.resolve_device(args.device)
    print(common.readiness(device), flush=True)
    model = build_model(args).to(device)
    params = n_params(model)
    step_model = torch.compile(model) if args.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    data = torch.Generator().manual_seed(args.seed)
    config = {
        k: getattr(args, k) for k in (*SIZES, "attn", "precision", "checkpointing", "compile", "lr", "seed")
    }
    config.update(device=str(device), n_params=params)
    flops = transformer_flops_per_token(
        args.layers, args.d_model, args.seq_len, args.vocab, n_params=matmul_params(model), training=True
    )
    tokens_per_step = args.batch * args.seq_len
    common.reset_peak(device)
    losses = []
    with gpuwatch.track(
        name=args.name or "gpt-train", config=config, flops_per_token=flops, precision=args.precision
    ) as run:
        started = None
        for step in range(args.steps):
            if step == 1:  # step 0 pays for warm-up (allocator, kernels, compile): time the rest
                common.synchronize(device)
                started = time.perf_counter()
            x, y = synthetic_batch(args, data, device)
            with common.autocast(device, args.precision):
                _, loss = step_model(x, y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            run.step(tokens=tokens_per_step, samples=args.batch, seq_len=args.seq_len, loss=loss.detach())
            losses.append(loss.detach())
        common.synchronize(device)
    elapsed = time.perf_counter() - started if started is not None else None
    return {
        "peak_bytes": common.peak_bytes(device),
        "tokens_per_s": tokens_per_step * (args.steps - 1) / elapsed if elapsed else None,
        "first_loss": float(losses[0]),
        "last_loss": float(losses[-1]),
        "n_params": params,
        "device": str(device),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workloads.gpt_train", description=__doc__.split("\n\n")[0])
    common.add_size_args(p, SIZES)
    p.add_argument(
        "--attn",
        choices=("naive", "sdpa"),
        default="sdpa",
        help="naive materialises the B*H*L*L scores; sdpa = F.scaled_dot_product_attention",
    )
    p.add_argument(
        "--checkpointing",
        action="store_true",
        help="activation checkpointing per block (torch.utils.checkpoint, use_reentrant=False)",
    )
    p.add_argument("--compile", action="store_true", help="torch.compile the model (slow to start)")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    common.add_common_args(p)
    return p


def check_shape(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} is not divisible by --heads {args.heads}")


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = common.parse_args(p, argv)
    check_shape(p, args)
    try:
        result = train(args)
    except (torch.OutOfMemoryError, RuntimeError, MemoryError) as e:
        from gpuwatch.client.run import is_oom

        if not is_oom(e):
            raise
        # gpuwatch has recorded the run as 'oom'; say so in one line and in the result line.
        print(
            f"out of memory at batch {args.batch} x seq {args.seq_len}: {str(e).splitlines()[0]}",
            file=sys.stderr,
        )
        device = common.resolve_device(args.device)
        # The allocator's state while the failed step's tensors are still held (by `e`'s frames):
        # what gpuwatch's postmortem recorded, for `gpuwatch selftest` to compare.
        at_oom = (
            {
                "free_bytes": torch.cuda.mem_get_info(device)[0],
                "reserved_bytes": torch.cuda.memory_reserved(device),
            }
            if device.type == "cuda"
            else {}
        )
        common.print_result(oom=True, peak_bytes=common.peak_bytes(device), tokens_per_s=None, **at_oom)
        return 1
    tps = result["tokens_per_s"]
    print(
        f"gpt_train: {result['n_params'] / 1e6:.2f}M params, batch {args.batch} x seq {args.seq_len}, "
        f"{args.attn}, {args.precision}{', checkpointing' if args.checkpointing else ''} on {result['device']}"
    )
    print(
        f"  loss {result['first_loss']:.3f} -> {result['last_loss']:.3f} over {args.steps} steps; "
        f"{'%.0f tokens/s' % tps if tps else 'tokens/s: needs 2+ steps'}; "
        f"peak memory {common.human_bytes(result['peak_bytes'])} "
        f"({common.peak_label(common.resolve_device(args.device))})"
    )
    common.print_result(oom=False, peak_bytes=result["peak_bytes"], tokens_per_s=tps)
    return 0


if __name__ == "__main__":
    sys.exit(main())

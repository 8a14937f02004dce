"""The articles' ContextualModel (Embedding -> LSTM -> Linear) trained on variable-length sequences.

    python -m workloads.lstm_context --tiny
    python -m workloads.lstm_context --max-len 4096 --batch 32 --device cuda

Each batch holds sequences of random lengths padded to the longest; pack_padded_sequence lets
the LSTM skip the padding, and tokens/s counts only real (unpadded) tokens.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from workloads import common

SIZES = {
    "batch": (int, 16, 8, "sequences per step"),
    "min_len": (int, 128, 8, "shortest sequence"),
    "max_len": (int, 2048, 64, "longest sequence (the padded length)"),
    "vocab": (int, 10000, 512, "vocabulary size"),
    "embed_dim": (int, 256, 32, "embedding width"),
    "hidden_dim": (int, 512, 64, "LSTM hidden size"),
    "steps": (int, 20, 8, "training steps"),
}
PAD = 0
IGNORE = -100  # cross_entropy's ignore_index: padded positions add nothing to the loss


class ContextualModel(nn.Module):
    def __init__(self, vocab_size: int, embed_dim: int, hidden_dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        self.lstm = nn.LSTM(embed_dim, hidden_dim, batch_first=True)
        self.classifier = nn.Linear(hidden_dim, vocab_size)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        embedded = self.embedding(x)
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        lstm_out, _ = self.lstm(packed)
        lstm_out, _ = pad_packed_sequence(lstm_out, batch_first=True, total_length=x.size(1))
        return self.classifier(lstm_out)


def variable_length_batch(args: argparse.Namespace, generator: torch.Generator, device):
    """Inputs, next-token targets (IGNORE on padding) and each sequence's real input length."""
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.batch,), generator=generator)
    seq = torch.randint(1, args.vocab, (args.batch, args.max_len + 1), generator=generator)
    positions = torch.arange(args.max_len + 1)
    seq[positions[None, :] > lengths[:, None]] = PAD  # lengths + 1 tokens give lengths input/target pairs
    x, y = seq[:, :-1].clone(), seq[:, 1:].clone()
    y[positions[None, 1:] > lengths[:, None]] = IGNORE
    return x.to(device), y.to(device), lengths


def train(args: argparse.Namespace) -> dict:
    import gpuwatch

    device = common.resolve_device(args.device)
    print(common.readiness(device), flush=True)
    torch.manual_seed(args.seed)
    model = ContextualModel(args.vocab, args.embed_dim, args.hidden_dim).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    data = torch.Generator().manual_seed(args.seed)
    config = {k: getattr(args, k) for k in (*SIZES, "precision", "lr", "seed")}
    config["device"] = str(device)
    common.reset_peak(device)
    real_tokens = padded_tokens = 0
    started = None
    with gpuwatch.track(name=args.name or "lstm-context", config=config, precision=args.precision) as run:
        for step in range(args.steps):
            if step == 1:  # step 0 pays for warm-up: time the rest
                common.synchronize(device)
                started, real_tokens, padded_tokens = time.perf_counter(), 0, 0
            x, y, lengths = variable_length_batch(args, data, device)
            with common.autocast(device, args.precision):
                logits = model(x, lengths)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), y.view(-1), ignore_index=IGNORE)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            tokens = int(lengths.sum())
            real_tokens += tokens
            padded_tokens += x.numel()
            run.step(tokens=tokens, samples=args.batch, seq_len=args.max_len, loss=loss.detach())
        common.synchronize(device)
    elapsed = time.perf_counter() - started if started is not None else None
    return {
        "tokens_per_s": real_tokens / elapsed if elapsed else None,
        "real_fraction": real_tokens / padded_tokens,
        "last_loss": float(loss.detach()),
        "peak_bytes": common.peak_bytes(device),
        "device": device,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workloads.lstm_context", description=__doc__.split("\n\n")[0])
    common.add_size_args(p, SIZES)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate")
    common.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = common.parse_args(p, argv)
    if args.min_len > args.max_len:
        p.error(f"--min-len {args.min_len} is longer than --max-len {args.max_len}")
    r = train(args)
    tps = f"{r['tokens_per_s']:.0f} real tokens/s" if r["tokens_per_s"] else "tokens/s: needs 2+ steps"
    print(
        f"lstm_context: batch {args.batch}, lengths {args.min_len}..{args.max_len}, "
        f"hidden {args.hidden_dim}, {args.precision} on {r['device']}"
    )
    print(
        f"  {tps} ({r['real_fraction']:.0%} of padded positions are real); last loss {r['last_loss']:.3f}; "
        f"peak memory {common.human_bytes(r['peak_bytes'])} ({common.peak_label(r['device'])})"
    )
    common.print_result(peak_bytes=r["peak_bytes"], tokens_per_s=r["tokens_per_s"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The articles' readiness probe: is CUDA usable, and can it embed a long batch without running out?

    python -m workloads.embedding_probe                 # B=8, L=4096, vocab 50257, d 768
    python -m workloads.embedding_probe --seq-len 32768 --precision bf16

nn.Embedding(vocab, d) over B x L random token ids, forward under no_grad; reports the output
shape, the output's size in bytes (B*L*d*element size, about 100 MB in fp32 at the defaults),
and the peak memory.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn

from workloads import common

SIZES = {
    "batch": (int, 8, 2, "sequences"),
    "seq_len": (int, 4096, 512, "tokens per sequence"),
    "vocab": (int, 50257, 50257, "vocabulary size"),
    "d_model": (int, 768, 128, "embedding width"),
    "repeats": (int, 3, 3, "forward passes (each one a step)"),
}


def probe(args: argparse.Namespace) -> dict:
    import gpuwatch

    device = common.resolve_device(args.device)
    print(common.readiness(device), flush=True)
    dtype = common.autocast_dtype(args.precision) or torch.float32  # no matmul here: store weights at it
    torch.manual_seed(args.seed)
    embed = nn.Embedding(args.vocab, args.d_model).to(device=device, dtype=dtype)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq_len)).to(device)
    config = {k: getattr(args, k) for k in (*SIZES, "precision", "seed")}
    config["device"] = str(device)
    common.reset_peak(device)
    seconds = []
    with (
        gpuwatch.track(name=args.name or "embedding-probe", config=config, precision=args.precision) as run,
        torch.no_grad(),
    ):
        for _ in range(args.repeats):
            common.synchronize(device)
            t0 = time.perf_counter()
            out = embed(input_ids)
            common.synchronize(device)
            seconds.append(time.perf_counter() - t0)
            run.step(tokens=args.batch * args.seq_len, samples=args.batch, seq_len=args.seq_len)
    return {
        "shape": tuple(out.shape),
        "output_bytes": out.nelement() * out.element_size(),
        "weight_bytes": embed.weight.nelement() * embed.weight.element_size(),
        "tokens_per_s": args.batch * args.seq_len / min(seconds),
        "peak_bytes": common.peak_bytes(device),
        "device": device,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads.embedding_probe", description=__doc__.split("\n\n")[0]
    )
    common.add_size_args(p, SIZES)
    common.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(parser(), argv)
    r = probe(args)
    print(
        f"embedding_probe: output shape {list(r['shape'])} ({args.precision}) = "
        f"{r['output_bytes']:,} bytes ({r['output_bytes'] / 1e6:.1f} MB); "
        f"weights {r['weight_bytes'] / 1e6:.1f} MB"
    )
    print(
        f"  {r['tokens_per_s']:.0f} tokens/s (best of {args.repeats}); peak memory "
        f"{common.human_bytes(r['peak_bytes'])} ({common.peak_label(r['device'])}); no OOM"
    )
    common.print_result(
        output_bytes=r["output_bytes"], peak_bytes=r["peak_bytes"], tokens_per_s=r["tokens_per_s"]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

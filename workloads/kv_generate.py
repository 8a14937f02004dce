"""KV-cache generation with the gpt_train decoder: prefill a prompt, then decode token by token.

    python -m workloads.kv_generate --tiny
    python -m workloads.kv_generate --prompt-len 8192 --new-tokens 256 --precision bf16

Reports time to first token (the prefill), inter-token latency and decode tokens/s, through
gpuwatch's run.generate() helper, plus the KV cache's size and the peak memory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from workloads import common, gpt_train

SIZES = {
    "prompt_len": (int, 1024, 48, "prompt tokens per sequence"),
    "new_tokens": (int, 128, 16, "tokens to generate per sequence"),
    "batch": (int, 1, 1, "sequences generated together"),
    "generations": (int, 3, 2, "generations to run (each with a fresh prompt and cache)"),
    "layers": (int, 12, 2, "decoder blocks"),
    "d_model": (int, 768, 64, "model width"),
    "heads": (int, 12, 4, "attention heads"),
    "vocab": (int, 50257, 512, "vocabulary size"),
}


def next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """Greedy at temperature 0, else a sample; returns (batch, 1) token ids."""
    last = logits[:, -1].float()
    if temperature <= 0:
        return last.argmax(dim=-1, keepdim=True)
    probs = (last / temperature).softmax(dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).to(logits.device)


def generate_once(
    model: gpt_train.GPT, prompt: torch.Tensor, new_tokens: int, args, device, g, generator: torch.Generator
) -> tuple[torch.Tensor, list[float], int]:
    """Prefill then decode, calling g.token() as each token lands.

    Returns the new tokens (batch, new_tokens), the start time and each token's time, and the
    KV cache's size in bytes."""
    cache = model.new_cache(
        prompt.size(0), prompt.size(1) + new_tokens, common.autocast_dtype(args.precision)
    )
    times = [time.perf_counter()]

    def landed(logits: torch.Tensor) -> torch.Tensor:
        token = next_token(logits, args.temperature, generator)
        common.synchronize(device)  # a token counts when it exists, not when its kernel is queued
        times.append(time.perf_counter())
        g.token(n=token.size(0))  # one new token per sequence
        return token

    out = [landed(model(prompt, cache=cache)[0])]  # prefill: the whole prompt in one pass
    while len(out) < new_tokens:
        out.append(landed(model(out[-1], cache=cache)[0]))  # decode: one position against the cache
    return torch.cat(out, dim=1), times, cache.nbytes


def run(args: argparse.Namespace) -> dict:
    import gpuwatch

    device = common.resolve_device(args.device)
    print(common.readiness(device), flush=True)
    args.seq_len, args.checkpointing = args.prompt_len + args.new_tokens, False  # positions the model needs
    model = gpt_train.build_model(args).to(device).eval()
    data = torch.Generator().manual_seed(args.seed)
    config = {k: getattr(args, k) for k in (*SIZES, "attn", "precision", "temperature", "seed")}
    config["device"] = str(device)
    common.reset_peak(device)
    ttfts, itls, decode_seconds = [], [], 0.0
    with (
        gpuwatch.track(name=args.name or "kv-generate", config=config, precision=args.precision) as tracked,
        torch.no_grad(),
        common.autocast(device, args.precision),
    ):
        for _ in range(args.generations):
            prompt = torch.randint(0, args.vocab, (args.batch, args.prompt_len), generator=data).to(device)
            common.synchronize(device)
            with tracked.generate(prompt_tokens=args.batch * args.prompt_len) as g:
                _, times, cache_bytes = generate_once(model, prompt, args.new_tokens, args, device, g, data)
            ttfts.append((times[1] - times[0]) * 1000)
            itls += [(b - a) * 1000 for a, b in zip(times[1:], times[2:])]
            decode_seconds += times[-1] - times[1]
    decoded = args.generations * args.batch * (args.new_tokens - 1)  # tokens after the first
    return {
        "ttft_ms": statistics.median(ttfts),
        "itl_p50_ms": statistics.median(itls) if itls else None,
        "tokens_per_s": decoded / decode_seconds if decode_seconds else None,
        "kv_cache_bytes": cache_bytes,
        "peak_bytes": common.peak_bytes(device),
        "device": device,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workloads.kv_generate", description=__doc__.split("\n\n")[0])
    common.add_size_args(p, SIZES)
    p.add_argument("--attn", choices=("naive", "sdpa"), default="sdpa", help="attention implementation")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), else sample")
    common.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = common.parse_args(p, argv)
    gpt_train.check_shape(p, args)
    r = run(args)
    itl = f"{r['itl_p50_ms']:.2f} ms" if r["itl_p50_ms"] is not None else "n/a (one token)"
    tps = f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "n/a"
    print(
        f"kv_generate: {args.generations} x (batch {args.batch}, prompt {args.prompt_len} -> "
        f"{args.new_tokens} new tokens), {args.attn}, {args.precision} on {r['device']}"
    )
    print(
        f"  TTFT p50 {r['ttft_ms']:.1f} ms; inter-token p50 {itl}; decode {tps} tokens/s; "
        f"KV cache {common.human_bytes(r['kv_cache_bytes'])}; "
        f"peak memory {common.human_bytes(r['peak_bytes'])} ({common.peak_label(r['device'])})"
    )
    common.print_result(
        ttft_ms=r["ttft_ms"],
        itl_p50_ms=r["itl_p50_ms"],
        tokens_per_s=r["tokens_per_s"],
        kv_cache_bytes=r["kv_cache_bytes"],
        peak_bytes=r["peak_bytes"],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

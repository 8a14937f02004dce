"""Data-parallel GPT training under torchrun: one process per GPU (or CPU rank), gradients all-reduced.

    torchrun --nproc_per_node=2 -m workloads.ddp_train --tiny          # gloo on a CPU
    torchrun --nproc_per_node=8 -m workloads.ddp_train --seq-len 4096 --precision bf16

NCCL on GPUs (rank i uses cuda:LOCAL_RANK), gloo on CPUs. Every rank is its own gpuwatch run;
the client reads torchrun's environment, so all ranks share one job id. A DistributedSampler
gives each rank a disjoint shard of the synthetic dataset.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from workloads import common, gpt_train

SIZES = {
    **{k: v for k, v in gpt_train.SIZES.items() if k != "steps"},
    "batch": (int, 8, 4, "sequences per step on each rank"),
    "samples": (int, 1024, 32, "sequences in the synthetic dataset (shared out between ranks)"),
    "steps": (int, 20, 4, "training steps"),
}
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def rank_device(requested: str | None, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when running on GPUs, so each rank has its own; else the CPU."""
    device = common.resolve_device(requested)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        common.resolve_device(str(device))  # fails clearly if this node has too few GPUs
        torch.cuda.set_device(device)
    return device


def synthetic_dataset(args: argparse.Namespace) -> TensorDataset:
    """The same sequences on every rank (same seed); the sampler decides who trains on which."""
    generator = torch.Generator().manual_seed(args.seed)
    return TensorDataset(torch.randint(0, args.vocab, (args.samples, args.seq_len + 1), generator=generator))


def train(args: argparse.Namespace, rank: int, world_size: int, device: torch.device) -> dict:
    import gpuwatch
    from gpuwatch.client.flops import transformer_flops_per_token

    model = gpt_train.build_model(args).to(device)
    ddp_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")
    sampler = DistributedSampler(
        synthetic_dataset(args),
        num_replicas=world_size,
        rank=rank,
        shuffle=True,
        seed=args.seed,
        drop_last=True,
    )
    loader = DataLoader(sampler.dataset, batch_size=args.batch, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise SystemExit(
            f"error: --samples {args.samples} gives each of {world_size} ranks fewer than "
            f"--batch {args.batch} sequences"
        )
    config = {k: getattr(args, k) for k in (*SIZES, "attn", "precision", "checkpointing", "lr", "seed")}
    config.update(device=str(device), backend=dist.get_backend(), shard_samples=len(sampler))
    flops = transformer_flops_per_token(
        args.layers,
        args.d_model,
        args.seq_len,
        args.vocab,
        n_params=gpt_train.matmul_params(model),
        training=True,
    )
    tokens_per_step = args.batch * args.seq_len
    common.reset_peak(device)
    step, epoch, started = 0, 0, None
    with gpuwatch.track(
        name=args.name or "ddp-train", config=config, flops_per_token=flops, precision=args.precision
    ) as run:
        while step < args.steps:
            sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
            for (seq,) in loader:
                if step == 1:  # step 0 pays for warm-up: time the rest
                    common.synchronize(device)
                    started = time.perf_counter()
                seq = seq.to(device, non_blocking=True)
                with common.autocast(device, args.precision):
                    _, loss = ddp_model(seq[:, :-1], seq[:, 1:])
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()  # DDP all-reduces gradients during backward
                scaler.step(optimizer)
                scaler.update()
                run.step(tokens=tokens_per_step, samples=args.batch, seq_len=args.seq_len, loss=loss.detach())
                step += 1
                if step == args.steps:
                    break
            epoch += 1
        common.synchronize(device)
    elapsed = time.perf_counter() - started if started is not None else 0.0
    # Job totals: tokens/s summed over ranks (each rank's own rate), the largest rank's peak.
    totals = torch.tensor(
        [tokens_per_step * (args.steps - 1) / elapsed if elapsed else 0.0, float(common.peak_bytes(device))],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(totals[:1], op=dist.ReduceOp.SUM)
    dist.all_reduce(totals[1:], op=dist.ReduceOp.MAX)
    return {
        "tokens_per_s": totals[0].item() or None,
        "peak_bytes": int(totals[1].item()),
        "last_loss": float(loss.detach()),
        "run_id": run.run_id,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun --nproc_per_node=N -m workloads.ddp_train", description=__doc__.split("\n\n")[0]
    )
    common.add_size_args(p, SIZES)
    p.add_argument("--attn", choices=("naive", "sdpa"), default="sdpa", help="attention implementation")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing per block")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    common.add_common_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = common.parse_args(p, argv)
    gpt_train.check_shape(p, args)
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        p.error(
            f"not started by torchrun ({', '.join(missing)} unset); run: "
            f"torchrun --nproc_per_node=2 -m workloads.ddp_train {' '.join(sys.argv[1:])}".rstrip()
        )
    rank, local_rank, world_size = (int(os.environ[v]) for v in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    device = rank_device(args.device, local_rank)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        if rank == 0:
            print(
                common.readiness(device) + f"; {world_size} ranks, backend {dist.get_backend()}", flush=True
            )
        r = train(args, rank, world_size, device)
        print(
            f"ddp_train rank {rank}/{world_size}: gpuwatch run {r['run_id']}, last loss {r['last_loss']:.3f}",
            flush=True,
        )
        dist.barrier()  # rank 0's summary comes last
        if rank == 0:
            tps = (
                f"{r['tokens_per_s']:.0f} tokens/s over all ranks"
                if r["tokens_per_s"]
                else "tokens/s: needs 2+ steps"
            )
            print(
                f"ddp_train: {world_size} ranks x batch {args.batch} x seq {args.seq_len}, {args.precision}; "
                f"{tps}; peak memory {common.human_bytes(r['peak_bytes'])} on the fullest rank "
                f"({common.peak_label(device)})"
            )
            common.print_result(
                peak_bytes=r["peak_bytes"], tokens_per_s=r["tokens_per_s"], world_size=world_size
            )
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # torch 2.13's gloo worker threads can still be freeing the last collective's tensors after
    # main() returns; one that then needs the GIL while the interpreter shuts down aborts the rank
    # ("terminate called without an active exception"; pytorch/pytorch#190489, seen here about
    # once in 60 runs on 2 busy cores). The run is recorded and the summary printed by now, and the
    # process group is destroyed, so the rank leaves without interpreter shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

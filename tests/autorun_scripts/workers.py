"""Unmodified: training in processes the program starts itself. Arg:
hogwild-fork | hogwild-spawn   two multiprocessing workers (worker1, worker2) train one shared
                               model (Hogwild), 4 steps each (20 ms in the loader, then 30 ms
                               asleep after the step); with "fails", worker2 raises after its
                               2nd step
tracked-spawn                  two spawned workers that call gpuwatch.track() and run.step()
                               themselves, 3 steps each
ddp-spawn                      torch.multiprocessing.spawn, two gloo DDP ranks, 3 steps each
                               (no RANK or WORLD_SIZE in the environment)
loader-fork | loader-spawn     the program trains 4 steps itself on a DataLoader whose 2 workers
                               call a module transform (as torchvision's are nn.Modules)
pool-fork                      the program trains 4 steps, then a forked multiprocessing.Pool
                               scores batches with its model, left in training mode (the Pool
                               ends its workers with SIGTERM as the `with` block closes)
Prints "<who> step N loss X" for every step, each line in one write (the processes share stdout)."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from tiny_model import TinyLM, V, batch

STEPS = 4


def say(line):
    os.write(1, (line + "\n").encode())  # whole: print() may split it, between processes


def step(model, opt, x):
    loss = nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


class Jitter(nn.Module):
    """A transform without parameters: a module call, in training mode, in every worker."""

    def forward(self, ids):
        return (ids + torch.randint(0, 2, ids.shape)) % V


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.transform = Jitter()

    def __len__(self):
        return 4 * STEPS

    def __getitem__(self, i):
        time.sleep(0.005)  # 20 ms a batch of 4
        return self.transform(torch.arange(16) % V)


def hogwild(worker, model, fails):
    torch.manual_seed(worker)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(Tokens(), batch_size=4)  # in this process: its transform too
    for n, x in enumerate(data, 1):
        say(f"worker{worker} step {n} loss {step(model, opt, x):.6f}")
        time.sleep(0.03)  # not data: what else a worker does between steps
        if fails and worker == 2 and n == 2:
            raise RuntimeError("worker 2 gave up")


def tracked(worker):
    import gpuwatch

    gen = torch.Generator().manual_seed(worker)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gpuwatch.track() as run:
        for n in range(1, 4):
            loss = step(model, opt, batch(gen))
            run.step(tokens=64, loss=loss)
            say(f"worker{worker} step {n} loss {loss:.6f}")


def ddp(rank, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    gen = torch.Generator().manual_seed(rank)
    model = nn.parallel.DistributedDataParallel(TinyLM())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in range(1, 4):
        say(f"rank{rank} step {n} loss {step(model, opt, batch(gen)):.6f}")
    dist.destroy_process_group()


def loader(context):
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.DataLoader(Tokens(), batch_size=4, num_workers=2, multiprocessing_context=context)
    for n, x in enumerate(data, 1):
        say(f"main step {n} loss {step(model, opt, x):.6f}")


def score(x):
    return nn.functional.cross_entropy(pooled(x).view(-1, V), x.view(-1)).item()


def pool(context):
    global pooled
    torch.manual_seed(0)
    pooled = TinyLM()
    opt = torch.optim.SGD(pooled.parameters(), lr=0.01)
    for n in range(1, STEPS + 1):
        say(f"main step {n} loss {step(pooled, opt, batch(torch.Generator().manual_seed(n))):.6f}")
    with mp.get_context(context).Pool(2) as workers:
        say(f"scores {workers.map(score, [batch(torch.Generator().manual_seed(n)) for n in range(4)])}")


if __name__ == "__main__":
    how = sys.argv[1]
    if how.startswith("hogwild"):
        context = mp.get_context(how.split("-")[1])
        torch.manual_seed(0)
        shared = TinyLM()
        shared.share_memory()
        workers = [
            context.Process(target=hogwild, args=(w, shared, "fails" in sys.argv), name=f"worker{w}")
            for w in (1, 2)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    elif how == "tracked-spawn":
        workers = [
            mp.get_context("spawn").Process(target=tracked, args=(w,), name=f"worker{w}") for w in (1, 2)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    elif how == "ddp-spawn":
        mp.spawn(ddp, args=(2,), nprocs=2)
    elif how.startswith("pool"):
        pool(how.split("-")[1])
    else:
        loader(how.split("-")[1])

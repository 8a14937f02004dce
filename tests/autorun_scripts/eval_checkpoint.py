"""Unmodified: epochs over a slow DataLoader (its dataset applies a module transform, as
torchvision's are modules), each ending with an evaluation pass (eval mode,
no_grad, its own loader) and a checkpoint (torch.save). Prints, per step, the milliseconds the
program itself measured inside the training loader since its previous step (the first: since
the loop began).
Args: CHECKPOINT [micro-batches] (two batches a step, a backward each, as gradient accumulation
does; after the evaluation and checkpoint, a generation calls a part of the model with no
loader, as x-transformers' generate() calls its wrapper's net)."""

import sys
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

DATA_S, COMPUTE_S = 0.004, 0.006


class Normalize(nn.Module):
    """A transform like torchvision's: a module without parameters, called in the loader."""

    def forward(self, x):
        return (x - 0.5) / 0.25


class Slow(Dataset):
    def __init__(self, n, delay):
        self.n, self.delay = n, delay
        self.transform = Normalize()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return self.transform(torch.full((8,), float(i)))


class Body(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        time.sleep(COMPUTE_S)  # the model's compute
        return self.linear(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Body()

    def forward(self, x):
        return self.body(x)


micro = 2 if sys.argv[2:] == ["micro-batches"] else 1
torch.manual_seed(0)
model = Model()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
train = DataLoader(Slow(16 * micro, DATA_S), batch_size=4)
val = DataLoader(Slow(16, DATA_S / 2), batch_size=4)  # its batches: the evaluation's time
step = 0
for epoch in range(3):
    it, in_loader = iter(train), 0.0
    while True:
        try:
            for _ in range(micro):
                started = time.perf_counter()
                x = next(it)
                in_loader += time.perf_counter() - started
                model(x).square().mean().backward()
        except StopIteration:
            break
        opt.step()
        opt.zero_grad()
        step += 1
        print(f"step {step} loader_ms {1000 * in_loader:.3f}")
        in_loader = 0.0
    model.eval()
    with torch.no_grad():
        for x in val:
            model(x)
    torch.save(model.state_dict(), sys.argv[1])
    with torch.no_grad():
        for _ in range(4 if micro > 1 else 0):
            x = model.body(x)
    model.train()
print("epochs done")

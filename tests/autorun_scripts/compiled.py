"""Unmodified, compiled four ways (arg): `module` — nanoGPT-style `model = torch.compile(model)`;
`inplace` — `model.compile()`; `step` — the whole training step (forward, loss, backward) in one
compiled function; `optimizer` — a compiled optimiser step. A train loop with eval in between.
Prints each step's loss and, at the end, dynamo's own count of the graphs it compiled (eager
backend: quick on CPU)."""

import copy
import pickle
import sys

import torch
from tiny_model import TinyLM, V, batch

how = sys.argv[1] if len(sys.argv) > 1 else "module"
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = TinyLM()
opt = torch.optim.SGD(model.parameters(), 1e-2)
if how == "module":
    model = torch.compile(model, backend="eager")
elif how == "inplace":
    model.compile(backend="eager")


def train_step(x):
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    loss.backward()
    return loss


def optimizer_step():
    opt.step()


if how == "step":
    train_step = torch.compile(train_step, backend="eager")
if how == "optimizer":
    optimizer_step = torch.compile(optimizer_step, backend="eager")
for step in range(6):
    loss = train_step(batch(gen))
    optimizer_step()
    opt.zero_grad()
    if step % 2 == 1:
        model.eval()
        with torch.no_grad():
            model(batch(gen))
        model.train()
    print(f"step {step + 1} loss {loss.item():.6f}")
pickle.loads(pickle.dumps(copy.deepcopy(model)))
counters = torch._dynamo.utils.counters
print("graphs compiled:", counters["stats"]["unique_graphs"])

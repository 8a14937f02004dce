"""Unmodified loops whose model returns logits and whose loss is computed outside forward.
Arg: sgd (parameters updated by hand under no_grad, no torch.optim: the PyTorch examples' way)
| scaler (AMP's GradScaler scales the loss before backward) | one-element (an optimiser's loop whose
loss has shape (1,), as DataParallel's gather leaves it). Prints each step's loss."""

import sys

import torch
from tiny_model import TinyLM, V, batch

torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = TinyLM()
if sys.argv[1] != "sgd":
    opt = torch.optim.SGD(model.parameters(), 0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for step in range(5):
    x = batch(gen)
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    if sys.argv[1] == "sgd":
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    elif sys.argv[1] == "one-element":
        loss = loss.view(1)
        loss.backward()
        opt.step()
        opt.zero_grad()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    print(f"step {step + 1} loss {loss.item():.6f}")

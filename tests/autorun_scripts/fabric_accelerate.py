"""Unmodified loops on Lightning Fabric or accelerate (no Trainer): the model is wrapped by the
library, backward goes through it. Arg: fabric | accelerate. Prints each step's loss."""

import sys

import torch
from tiny_model import TinyLM, V, batch

torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = TinyLM()
opt = torch.optim.SGD(model.parameters(), 0.1)
if sys.argv[1] == "fabric":
    from lightning.fabric import Fabric

    lib = Fabric(accelerator="cpu", devices=1)
    model, opt = lib.setup(model, opt)
else:
    from accelerate import Accelerator

    lib = Accelerator(cpu=True)
    model, opt = lib.prepare(model, opt)
for step in range(4):
    x = batch(gen)
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    lib.backward(loss)
    opt.step()
    opt.zero_grad()
    print(f"step {step + 1} loss {loss.item():.6f}")

"""Unmodified and deterministic: trains a few steps, keeps an EMA copy (deepcopy), pickles the
model, saves it whole and as a state_dict checkpoint, scripts, traces and exports it.
Args: OUT_DIR. Prints what it did; the files it writes must not depend on who watched it."""

import copy
import pickle
import sys
from pathlib import Path

import torch
from tiny_model import TinyLM, V, batch

out = Path(sys.argv[1])
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = TinyLM()
ema = None
opt = torch.optim.AdamW(model.parameters(), 1e-2)
for step in range(4):
    x = batch(gen)
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    ema = copy.deepcopy(model) if ema is None else ema  # every EMA implementation starts so
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.9).add_(p, alpha=0.1)
    print(f"step {step + 1} loss {loss.item():.6f}")
copied = pickle.loads(pickle.dumps(model))
torch.save(model, out / "whole.pt")
torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict()}, out / "ckpt.pt")
scripted = torch.jit.script(model)
traced = torch.jit.trace(model, (batch(gen),))
exported = torch.export.export(model, (batch(gen),))
x = batch(gen)
same = [torch.equal(model(x), m(x)) for m in (copied, scripted, traced, exported.module())]
print("copies agree:", same)
left = [
    (name, len(m._forward_hooks), len(m._forward_pre_hooks))
    for name, m in model.named_modules()
    if m._forward_hooks or m._forward_pre_hooks
]
print("hooks left on the model:", left)
# torch's own error for backward() on a non-scalar with no gradient given, whatever hooks read it
try:
    (model(x) * 2).backward()
except RuntimeError as e:
    print("a non-scalar's backward:", e)

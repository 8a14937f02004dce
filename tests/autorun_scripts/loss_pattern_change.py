"""A loop whose model returns logits, with the loss computed outside forward and an optimiser:
12 iterations of 2 accumulated micro-batches (each loss divided by 2 before backward()), then 6
in which an auxiliary module's loss, not through the model, is backpropagated after the model's
forward and before its loss. Prints each step's loss (the mean micro-batch loss).
With `returned`: the model returns (logits, loss), as nanoGPT's does."""

import sys

import torch
from tiny_model import TinyLM, V, batch


class WithLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lm = TinyLM()

    def forward(self, idx, targets):
        logits = self.lm(idx)
        return logits, torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1))


returned = sys.argv[1:] == ["returned"]
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = WithLoss() if returned else TinyLM()
aux = torch.nn.Linear(4, 1)
opt = torch.optim.SGD([*model.parameters(), *aux.parameters()], 0.1)
for step in range(18):
    micro = 2 if step < 12 else 1
    total = 0.0
    for _ in range(micro):
        x = batch(gen)
        if returned:
            logits, loss = model(x, x)
        else:
            logits = model(x)
        if step >= 12:
            aux(torch.randn(3, 4, generator=gen)).pow(2).mean().backward()
        if not returned:
            loss = torch.nn.functional.cross_entropy(logits.view(-1, V), x.view(-1))
        loss = loss / micro
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad()
    print(f"step {step + 1} loss {total:.6f}")

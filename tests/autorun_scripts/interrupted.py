"""Unmodified: Ctrl-C lands inside a forward (simulated: the forward raises KeyboardInterrupt),
the script catches it, trains on and then copies and pickles its model."""

import copy
import pickle

import torch
from tiny_model import TinyLM, V, batch


class Stoppable(TinyLM):
    stop = False

    def forward(self, input_ids):
        if self.stop:
            raise KeyboardInterrupt
        return super().forward(input_ids)


gen = torch.Generator().manual_seed(0)
model = Stoppable()
for step in range(6):  # updated by hand (torch.optim's first use imports dynamo: ~1 s a run)
    if step == 3:
        model.stop = True
        try:
            model(batch(gen))
        except KeyboardInterrupt:
            print("interrupted forward caught")
        model.stop = False
    x = batch(gen)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1)).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
pickle.dumps(copy.deepcopy(model))
print("copied and pickled; hooks left:", len(model._forward_hooks))

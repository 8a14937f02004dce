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
opt = torch.optim.SGD(model.parameters(), 0.1)
for step in range(6):
    if step == 3:
        model.stop = True
        try:
            model(batch(gen))
        except KeyboardInterrupt:
            print("interrupted forward caught")
        model.stop = False
    x = batch(gen)
    torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1)).backward()
    opt.step()
    opt.zero_grad()
pickle.dumps(copy.deepcopy(model))
print("copied and pickled; hooks left:", len(model._forward_hooks))

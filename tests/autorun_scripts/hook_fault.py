"""An unmodified loop, but gpuwatch's token counting is broken on purpose (as a bug of ours would
be): the program must run to the end exactly as without gpuwatch, with one warning line."""

import torch

torch.manual_seed(0)
try:
    from gpuwatch.integrations import accounting

    def broken(*args, **kwargs):  # the tally of each forward's tokens
        raise RuntimeError("simulated bug in gpuwatch's hook")

    accounting.StepTally.add = broken
except ImportError:  # a Python without gpuwatch
    pass

model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Flatten(), torch.nn.Linear(32, 2))
for step in range(3):  # updated by hand (torch.optim's first use imports dynamo: ~1 s a run)
    model.zero_grad()
    loss = model(torch.randint(0, 16, (2, 4))).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
print("final weight sum %.6f" % model[2].weight.sum().item())

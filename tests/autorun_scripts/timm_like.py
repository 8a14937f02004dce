"""Unmodified, timm train.py's shape: a task module called as task(images, labels) returns the
loss and holds the model beside an EMA copy of it (whose parameters still require grad, as
timm's ModelEmaV3 leaves them: only the optimiser tells them apart); two micro-batches a step,
each loss divided in place before its backward (`loss /= accum_steps`). Prints each step's loss
as timm logs it (the mean of its micro-batches' losses, read before the division) and the
model's parameter count."""

import copy

import torch
import torch.nn as nn

ACCUM = 2


class Task(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.ema = copy.deepcopy(model).eval()

    def forward(self, images, labels):
        return nn.functional.cross_entropy(self.model(images), labels)


torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 4))
task = Task(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    logged = 0.0
    for _ in range(ACCUM):
        images, labels = torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8,))
        loss = task(images, labels)
        logged += loss.item() / ACCUM
        loss /= ACCUM
        loss.backward()
    opt.step()
    opt.zero_grad()
    with torch.no_grad():
        for ema, p in zip(task.ema.parameters(), model.parameters()):
            ema.lerp_(p, 0.1)
    print(f"step {step + 1} loss {logged:.6f}")
print(f"params {sum(p.numel() for p in model.parameters())}")

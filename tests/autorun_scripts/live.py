"""An unmodified loop that keeps training (slowly) until it is stopped."""

import time

import torch

model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))


def train_one_step():  # updated by hand (no torch.optim, whose first use imports dynamo: ~1 s)
    x = torch.randint(0, 64, (4, 16))
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad


for _ in range(3000):
    train_one_step()
    time.sleep(0.02)

"""Unmodified: an LBFGS loop (pytorch/examples time_sequence_prediction's shape): step(closure)
evaluates the closure up to 20 times; the program prints what step() returned, its first."""

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
x, y = torch.randn(32, 4), torch.randn(32, 1)
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5)
evaluations = 0
for i in range(4):

    def closure():
        global evaluations
        evaluations += 1
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        return loss

    before = evaluations
    loss = optimizer.step(closure)
    print(f"step {i + 1} loss {loss.item():.9g} evaluations {evaluations - before}")

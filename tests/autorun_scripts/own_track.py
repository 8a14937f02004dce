"""A script that tracks itself: under `gpuwatch run` its own calls count, once."""

import torch

import gpuwatch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), 0.1)
with gpuwatch.track(name="own") as run:
    for _ in range(3):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        run.step(tokens=100, samples=4)

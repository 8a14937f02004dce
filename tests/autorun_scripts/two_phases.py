"""Unmodified: a fine-tuning in two phases, one optimiser at a time: the head alone, then a new
optimiser over the whole model replaces the first (`opt` rebound); with --up-front, both
optimisers are made before the first phase (a transfer-learning script's warm-up). Prints each
step's loss."""

import sys

import torch
import torch.nn as nn

torch.manual_seed(0)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.head = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


model = Model()
x, y = torch.randn(16, 8), torch.randn(16, 1)
opt = torch.optim.Adam(model.head.parameters(), lr=1e-2)
whole = torch.optim.SGD(model.parameters(), lr=1e-2) if "--up-front" in sys.argv else None
for phase in (1, 2):
    if phase == 2:
        opt = whole or torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(5):
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"phase {phase} loss {loss.item():.6f}")

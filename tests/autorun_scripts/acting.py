"""Unmodified: a DQN's loop (cleanRL's dqn.py): the trained network also picks actions, 0 to 3
times between two training steps, with gradients on and in training mode (its output only
argmax'd), then one training forward, backward and step. Prints each step's loss."""

import torch
import torch.nn as nn

torch.manual_seed(0)
q_network = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3)
for n, acting in enumerate([0, 1, 2, 0, 3, 1, 0, 0, 2, 1] * 2, 1):
    for _ in range(acting):
        action = q_network(torch.randn(1, 4)).argmax(dim=1)
    observations, targets = torch.randn(32, 4), torch.randn(32, 2)
    loss = ((q_network(observations) - targets) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {n} loss {loss.item():.6f}")

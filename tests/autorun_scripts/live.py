"""An unmodified loop that keeps training (slowly) until it is stopped."""

import time

import torch

model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def train_one_step():
    x = torch.randint(0, 64, (4, 16))
    torch.nn.functional.cross_entropy(model(x).view(-1, 64), x.view(-1)).backward()
    opt.step()
    opt.zero_grad()


for _ in range(3000):
    train_one_step()
    time.sleep(0.02)

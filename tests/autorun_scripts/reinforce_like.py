"""Unmodified, REINFORCE's shape (pytorch/examples reinforcement_learning/reinforce.py): a policy
called once per environment step, one backward and optimiser step per episode, episodes of
different lengths. Arg: all | first-unused (each episode begins with a forward whose output the
program drops: only the later ones are in its loss). Prints "step N loss X" per episode."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
policy = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
for episode in range(1, 13):
    if sys.argv[1] == "first-unused":
        policy(torch.randn(1, 4))  # a look at the start state, not in the loss
    log_probs, rewards = [], []
    for t in range(3 + episode % 5):
        probs = F.softmax(policy(torch.randn(1, 4)), dim=1)
        action = probs.multinomial(1)
        log_probs.append(torch.log(probs.gather(1, action)))
        rewards.append(float(action))
    returns = torch.tensor(rewards).flip(0).cumsum(0).flip(0)
    loss = -(torch.cat(log_probs).squeeze(1) * returns).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {episode} loss {loss.item():.6f}")

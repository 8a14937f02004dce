"""Unmodified: naive attention at L=16384 materialises 4 x 4 x 16384² float scores (16 GiB)."""

import torch
import torch.nn as nn

B, H, L, D = 4, 4, 16384, 8


class NaiveAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, H * D)

    def forward(self, input_ids):
        q = self.emb(input_ids).view(B, L, H, D).transpose(1, 2)
        scores = q @ q.transpose(-1, -2)  # B·H·L² floats: the allocation that cannot fit
        return scores.softmax(-1).mean()


model = NaiveAttention()
loss = model(torch.randint(0, 32, (B, L)))
loss.backward()
with torch.no_grad():  # (never reached) updated by hand: no torch.optim, whose first use imports dynamo
    for p in model.parameters():
        p -= 0.1 * p.grad

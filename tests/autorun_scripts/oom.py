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
opt = torch.optim.SGD(model.parameters(), 0.1)
loss = model(torch.randint(0, 32, (B, L)))
loss.backward()
opt.step()

"""Unmodified, sequence-first as in PyTorch's word language model example: (seq_len, batch) ids
into an embedding and an nn.TransformerEncoder left at batch_first=False. Arg: transformer | lstm."""

import sys

import torch
import torch.nn as nn

V, D, L, B = 64, 32, 16, 4
torch.manual_seed(0)


class SeqFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        if sys.argv[1] == "lstm":
            self.body = nn.LSTM(D, D)
        else:
            self.body = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(D, 2, 64), 1, enable_nested_tensor=False
            )
        self.head = nn.Linear(D, V)

    def forward(self, src):
        h = self.body(self.emb(src))
        return self.head(h[0] if isinstance(h, tuple) else h)


model = SeqFirst()
for _ in range(3):  # updated by hand, as that example does (no torch.optim: ~1 s quicker to start)
    src = torch.randint(0, V, (L, B))
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(src).view(-1, V), src.view(-1)).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad

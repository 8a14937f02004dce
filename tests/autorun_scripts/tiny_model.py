"""A small token model importable by the scripts here and by a loader that has no gpuwatch."""

import torch
import torch.nn as nn

V, D = 64, 32


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(D, D), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(D, V)

    def forward(self, input_ids):
        return self.head(self.blocks(self.emb(input_ids)))


def batch(generator, b=4, length=16):
    return torch.randint(0, V, (b, length), generator=generator)

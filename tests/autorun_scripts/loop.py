"""A hand-written loop: gradient accumulation over 4 micro-batches, an eval pass after each step,
two optimisers (one iteration is still one step). Untouched by gpuwatch: no import of it."""

import sys

import torch
import torch.nn as nn

V, L, B, STEPS = 64, 16, 4, 5
torch.manual_seed(0)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 32)
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(3)])
        self.head = nn.Linear(32, V)

    def forward(self, input_ids):
        return self.head(self.blocks(self.emb(input_ids)))


model, loss_fn = Model(), nn.CrossEntropyLoss()
body = torch.optim.AdamW([p for n, p in model.named_parameters() if not n.startswith("head")], 1e-2)
head = torch.optim.SGD(model.head.parameters(), 1e-2)
for step in range(STEPS):
    mean = 0.0
    for micro in range(4):
        x = torch.randint(0, V, (B, L))
        loss = loss_fn(model(x).view(-1, V), x.view(-1))  # the loss module is called at top level too
        (loss / 4).backward()
        mean += loss.item() / 4
    print(f"step {step + 1} loss {mean:.6f}")
    body.step()
    head.step()
    body.zero_grad()
    head.zero_grad()
    model.eval()
    with torch.no_grad():
        model(torch.randint(0, V, (8, L)))
    model.train()
print("trained", STEPS, "steps")
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)

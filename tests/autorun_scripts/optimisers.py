"""Unmodified: one backward() an iteration, then several optimisers over one model. Arg:
shared        AdamW over the matrices and SGD over the rest (nanochat's AdamW and Muon), both
              stepped after the backward
bare          the model's AdamW, and an Adam over a learnable temperature that is no module's
              parameter (SAC's log_alpha)
in-backward   an Adam per parameter, stepped from its post-accumulate-grad hook inside the
              backward (PyTorch's tutorial on fusing the step into it; torchtune's optimizer_in_bwd)
Prints "step N loss X" for every iteration."""

import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
V, D, T, B, STEPS = 64, 32, 16, 4, 6
model = nn.Sequential(nn.Embedding(V, D), nn.Linear(D, D), nn.ReLU(), nn.Linear(D, V))
temperature = torch.zeros(1, requires_grad=True)
how = sys.argv[1]
if how == "shared":
    matrices = [p for p in model.parameters() if p.ndim == 2]
    optimisers = [
        torch.optim.AdamW(matrices, lr=1e-2),
        torch.optim.SGD([p for p in model.parameters() if p.ndim != 2], lr=1e-2),
    ]
elif how == "bare":
    optimisers = [torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.Adam([temperature], lr=1e-2)]
else:
    per_parameter = {p: torch.optim.Adam([p]) for p in model.parameters()}

    def step_now(p):
        per_parameter[p].step()
        per_parameter[p].zero_grad()

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(step_now)
    optimisers = []
for n in range(1, STEPS + 1):
    data = torch.randint(0, V, (B, T + 1))
    logits = model(data[:, :-1]) / temperature.exp()
    loss = F.cross_entropy(logits.reshape(-1, V), data[:, 1:].reshape(-1))
    for opt in optimisers:
        opt.zero_grad()
    loss.backward()
    for opt in optimisers:
        opt.step()
    print(f"step {n} loss {loss.item():.6f}")

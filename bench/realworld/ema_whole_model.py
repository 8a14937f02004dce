"""A training script written the way many are: an EMA copy made with copy.deepcopy, and whole-model
checkpoints (torch.save(model)), loaded back with torch.load. Never imports gpuwatch.

    python ema_whole_model.py OUT_DIR [STEPS]
"""

import copy
import sys
import time
from pathlib import Path

import torch

out, steps = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 30
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
V, L, B = 128, 32, 8
model = torch.nn.Sequential(
    torch.nn.Embedding(V, 64), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, V)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ema = None
for step in range(1, steps + 1):
    x = torch.randint(0, V, (B, L))
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    if ema is None:
        ema = copy.deepcopy(model)  # after the first step, as EMA implementations do
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters()):
            e.mul_(0.99).add_(p, alpha=0.01)
    print(f"step {step} loss {loss.item():.6f} time {(time.perf_counter() - t0) * 1000:.3f}ms", flush=True)
    if step % 10 == 0:
        torch.save(model, out / "model.pt")
        torch.save(ema, out / "ema.pt")
reloaded = torch.load(out / "model.pt", weights_only=False)
print("reloaded", type(reloaded).__name__)

"""An accelerate training loop without a Trainer, as accelerate's examples write one: prepare(),
accelerator.backward(), the loss computed outside the model. Never imports gpuwatch.

    python accelerate_loop.py [STEPS]
"""

import sys
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

V, T, B = 128, 32, 8
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = torch.nn.Sequential(
    torch.nn.Embedding(V, 64), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, V)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = DataLoader(TensorDataset(torch.randint(0, V, (steps * B, T))), batch_size=B)
model, opt, data = accelerator.prepare(model, opt, data)
model.train()
for step, (x,) in enumerate(data, 1):
    t0 = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item():.6f} time {(time.perf_counter() - t0) * 1000:.3f}ms", flush=True)
accelerator.save(accelerator.unwrap_model(model).state_dict(), "accelerate_state.pt")

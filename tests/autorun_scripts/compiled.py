"""Unmodified, nanoGPT-style: `model = torch.compile(model)`, a train loop with eval in between.
Prints dynamo's own count of compiled frames and graphs at the end (eager backend: quick on CPU)."""
import torch
from tiny_model import V, TinyLM, batch

torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
model = TinyLM()
opt = torch.optim.SGD(model.parameters(), 1e-2)
model = torch.compile(model, backend="eager")
for step in range(6):
    x = batch(gen)
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, V), x.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 2 == 1:
        model.eval()
        with torch.no_grad():
            model(batch(gen))
        model.train()
    print(f"step {step + 1} loss {loss.item():.6f}")
counters = torch._dynamo.utils.counters
print("frames compiled:", counters["frames"]["ok"], "graphs:", counters["stats"]["unique_graphs"])

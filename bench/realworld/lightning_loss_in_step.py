"""A Lightning script in the style of Lightning's own examples: the loss is computed in
training_step, outside the module's forward. Never imports gpuwatch.

    python lightning_loss_in_step.py [STEPS]
"""

import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

V, T, B = 128, 32, 8
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30


class LitLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Embedding(V, 64), torch.nn.Linear(64, V))
        self._t0 = None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        self._t0 = time.perf_counter()
        (x,) = batch
        loss = torch.nn.functional.cross_entropy(self(x).view(-1, V), x.view(-1))
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        print(
            f"step {self.global_step} loss {outputs['loss'].item():.6f} "
            f"time {(time.perf_counter() - self._t0) * 1000:.3f}ms",
            flush=True,
        )

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


L.seed_everything(0)
data = DataLoader(TensorDataset(torch.randint(0, V, (steps * B, T))), batch_size=B)
L.Trainer(
    max_steps=steps,
    accelerator="cpu",
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
).fit(LitLM(), data)

"""An unmodified Lightning script: a tiny LM whose forward returns its loss, gradient accumulation 2,
Lightning's own ThroughputMonitor. Prints what Lightning logged as one JSON line (GPUWATCH_TEST ...).
Args: [--callback] adds gpuwatch's Lightning callback (the explicit, one-line integration);
[--tensorboard] logs to Lightning's TensorBoardLogger (lightning_logs/version_N) as well."""

import json
import sys
import time

import lightning.pytorch as pl
import torch
import torch.nn as nn
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loggers import Logger

V, L, B, STEPS, ACCUM = 64, 32, 4, 12, 2
torch.manual_seed(0)


class Counting(torch.utils.data.Dataset):
    def __len__(self):
        return B * ACCUM * STEPS

    def __getitem__(self, i):
        return {"input_ids": (torch.arange(L) * (1 + i % 3) + i) % V}


class TinyLM(pl.LightningModule):
    def __init__(self, d_model: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.emb, self.head = nn.Embedding(V, d_model), nn.Linear(d_model, V)

    def forward(self, input_ids):
        logits = self.head(self.emb(input_ids[:, :-1]))
        return nn.functional.cross_entropy(logits.reshape(-1, V), input_ids[:, 1:].reshape(-1))

    micro_losses = []

    def training_step(self, batch, batch_idx):
        loss = self(**batch)
        # A step's compute of ~20 ms: the tokens/s comparison then rests on the steps, not on the
        # few ms a first log call or a busy machine adds at the window's edges.
        time.sleep(0.01)
        self.log("train_loss", loss, on_step=True)
        self.micro_losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Remember(Logger):
    name, version, metrics = "remember", 0, []

    def log_metrics(self, metrics, step=None):
        self.metrics.append(dict(metrics, step=step))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


callbacks = [
    ThroughputMonitor(
        batch_size_fn=lambda b: b["input_ids"].shape[0],
        length_fn=lambda b: b["input_ids"].numel(),
        window_size=STEPS * ACCUM - 1,
    )
]
if "--callback" in sys.argv:
    from gpuwatch.integrations.lightning import GpuwatchCallback

    callbacks.append(GpuwatchCallback(name="lightning-explicit"))
loggers = [Remember()]
if "--tensorboard" in sys.argv:
    from lightning.pytorch.loggers import TensorBoardLogger

    loggers.append(TensorBoardLogger(save_dir="."))
trainer = pl.Trainer(
    max_steps=STEPS,
    accumulate_grad_batches=ACCUM,
    accelerator="cpu",
    devices=1,
    logger=loggers,
    log_every_n_steps=1,
    callbacks=callbacks,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(TinyLM(), torch.utils.data.DataLoader(Counting(), batch_size=B))
print(
    "GPUWATCH_TEST "
    + json.dumps(
        {
            "logged": Remember.metrics,
            "micro_losses": TinyLM.micro_losses,
            "callbacks": [type(c).__module__ for c in trainer.callbacks],
        }
    )
)

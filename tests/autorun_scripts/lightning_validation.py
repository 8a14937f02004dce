"""An unmodified Lightning script whose Trainer validates every 3 steps (0.3 s of validation
each time, calling the submodule it trains, not itself); prints the global step after which each validation ran ("validated after step N").
Args: [--callback] adds gpuwatch's Lightning callback (the explicit, one-line integration)."""

import sys
import time

import lightning.pytorch as pl
import torch

STEPS, EVERY = 9, 3
torch.manual_seed(0)


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self(x).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        time.sleep(0.15)
        (x,) = batch
        return self.layer(x).pow(2).mean()  # through a submodule, as many modules validate

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            print("validated after step", self.trainer.global_step, flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(64, 8))
callbacks = []
if "--callback" in sys.argv:
    from gpuwatch.integrations.lightning import GpuwatchCallback

    callbacks.append(GpuwatchCallback(name="lightning-explicit"))
trainer = pl.Trainer(
    max_steps=STEPS,
    val_check_interval=EVERY,
    limit_val_batches=2,
    accelerator="cpu",
    devices=1,
    logger=False,
    callbacks=callbacks,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
loader = torch.utils.data.DataLoader(data, batch_size=4)
trainer.fit(Tiny(), loader, torch.utils.data.DataLoader(data, batch_size=4))

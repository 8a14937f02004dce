"""Unmodified Lightning scripts. Arg:
manual-gan   manual optimisation (automatic_optimization = False), two optimisers: G steps on
             g_loss, then D on d_loss, in training_step, which returns nothing; prints
             "step N g G d D" a batch
remainder    accumulate_grad_batches=4 over 6 batches an epoch, 2 epochs: windows of 4 and 2
             micro-batches (Lightning divides each returned loss by 4, the last window's too);
             prints "micro EPOCH BATCH LOSS" a batch"""

import sys

import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F

HOW = sys.argv[1]
torch.manual_seed(0)


class Gan(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
        self.discriminator = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(x.shape[0], 8)
        ones, zeros = torch.ones(x.shape[0], 1), torch.zeros(x.shape[0], 1)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        real = F.binary_cross_entropy_with_logits(self.discriminator(x), ones)
        fake = F.binary_cross_entropy_with_logits(self.discriminator(self.generator(z).detach()), zeros)
        d_loss = (real + fake) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        print(f"step {batch_idx + 1} g {g_loss.item():.6f} d {d_loss.item():.6f}")

    def configure_optimizers(self):
        return torch.optim.Adam(self.generator.parameters(), 2e-4), torch.optim.Adam(
            self.discriminator.parameters(), 2e-4
        )


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = (self.net(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        print(f"micro {self.current_epoch} {batch_idx} {loss.item():.6f}")
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 16)), batch_size=8)
trainer = pl.Trainer(
    max_epochs=1 if HOW == "manual-gan" else 2,
    accumulate_grad_batches=1 if HOW == "manual-gan" else 4,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Gan() if HOW == "manual-gan" else Regression(), data)

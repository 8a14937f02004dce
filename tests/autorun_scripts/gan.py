"""Unmodified: a tiny DCGAN-shaped loop (pytorch/examples dcgan/main.py's order): D steps on
errD_real + errD_fake, then G on errG (whose graph goes through netD too); a DataLoader feeds
it, and every other iteration ends with G's images under no_grad. Prints each optimiser's loss."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
nz, ITERS = 8, 6
netG = nn.Sequential(nn.Linear(nz, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))
netD = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())
criterion = nn.BCELoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4)
loader = DataLoader(TensorDataset(torch.randn(ITERS * 4, 16)), batch_size=4)
fixed_noise = torch.randn(4, nz)
for i, (real,) in enumerate(loader):
    netD.zero_grad()
    label = torch.full((4,), 1.0)
    errD_real = criterion(netD(real).view(-1), label)
    errD_real.backward()
    fake = netG(torch.randn(4, nz))
    label.fill_(0.0)
    errD_fake = criterion(netD(fake.detach()).view(-1), label)
    errD_fake.backward()
    errD = errD_real + errD_fake
    optimizerD.step()
    netG.zero_grad()
    label.fill_(1.0)
    errG = criterion(netD(fake).view(-1), label)
    errG.backward()
    optimizerG.step()
    print(f"[{i + 1}] Loss_D: {errD.item():.6f} Loss_G: {errG.item():.6f}")
    if i % 2 == 1:
        with torch.no_grad():
            netG(fixed_noise)

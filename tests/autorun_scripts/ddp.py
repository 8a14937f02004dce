"""An unmodified DistributedDataParallel script for torchrun (gloo, CPU): 3 steps per rank.
Prints each rank's process age at its end (from psutil), for the test of the rank's duration."""

import time

import psutil
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32)))
opt = torch.optim.SGD(model.parameters(), 0.1)
for _ in range(3):
    x = torch.randint(0, 32, (2, 8))
    nn.functional.cross_entropy(model(x).view(-1, 32), x.view(-1)).backward()
    opt.step()
    opt.zero_grad()
rank = dist.get_rank()
dist.destroy_process_group()
print(f"rank {rank} age_s {time.time() - psutil.Process().create_time():.3f}")

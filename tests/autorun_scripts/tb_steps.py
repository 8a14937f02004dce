"""A tracked run that steps slowly, for the TensorBoard mirror: STEPS steps (argv[1], default 8)
every PAUSE seconds (argv[2], default 0.3), with a config. With --autolog DIR it is unmodified
training recorded by gpuwatch.autolog(tensorboard=DIR) instead. Under the fake NVML it puts
its pid where FAKE_NVML_PIDS_FILE says, so it is a process on the simulated GPUs."""

import os
import sys
import time

import torch

import gpuwatch

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 8
PAUSE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
if os.environ.get("FAKE_NVML_PIDS_FILE"):
    with open(os.environ["FAKE_NVML_PIDS_FILE"], "w") as f:
        f.write(str(os.getpid()))
model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))


def one_step() -> float:  # updated by hand (no torch.optim, whose first use imports dynamo: ~1 s)
    x = torch.randint(0, 64, (4, 32))
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, 64), x.view(-1))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return loss.item()


if "--autolog" in sys.argv:
    gpuwatch.autolog(name="tb-autolog", tensorboard=sys.argv[sys.argv.index("--autolog") + 1])
    for _ in range(STEPS):
        one_step()
        time.sleep(PAUSE)
else:
    with gpuwatch.track(name="tb-steps", config={"lr": 0.1, "model": {"width": 16}}) as run:
        for _ in range(STEPS):
            run.step(tokens=128, samples=4, loss=one_step())
            time.sleep(PAUSE)

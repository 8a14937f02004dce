#!/usr/bin/env bash
# Regenerates docs/images/tensorboard.png: a script that logs its own loss to TensorBoard runs
# under `gpuwatch run --tensorboard auto` on two simulated GPUs (tests/fake_driver), then a real
# `tensorboard` on loopback is photographed by headless Chromium, our curves beside the script's.
# Usage: bash docs/tensorboard_screenshot.sh   (needs the dev install and Debian's chromium)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d)
trap 'kill $tb 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/train.py" <<'PY'
import os, time, torch
from torch.utils.tensorboard import SummaryWriter
open(os.environ["FAKE_NVML_PIDS_FILE"], "w").write(str(os.getpid()))  # on the simulated GPUs
writer = SummaryWriter("runs/exp1")
model = torch.nn.Sequential(torch.nn.Embedding(64, 64), torch.nn.Linear(64, 64))
opt = torch.optim.AdamW(model.parameters(), 3e-3)
for step in range(1, 121):
    x = torch.randint(0, 64, (16, 64))
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, 64), ((x + 1) % 64).view(-1))
    loss.backward(); opt.step(); opt.zero_grad()
    writer.add_scalar("train/loss", loss.item(), step)
    writer.add_scalar("train/lr", 3e-3, step)
    time.sleep(0.05 if step % 40 else 2.0)  # an evaluation pause every 40 steps
writer.close()
PY
cd "$work"
env PYTHONPATH="$repo/tests/fake_driver:$repo" FAKE_NVML_GPUS=2 FAKE_NVML_GPM=1 \
    FAKE_NVML_PIDS_FILE="$work/pids" CUDA_VISIBLE_DEVICES=0,1 GPUWATCH_INTERVAL=0.5 \
    GPUWATCH_PROCESS_INTERVAL=0.5 XDG_DATA_HOME="$work/data" GPUWATCH_CONFIG="$work/none.toml" \
    "$(dirname "$py")/gpuwatch" run --name exp1 --tensorboard auto -- "$py" train.py
"$(dirname "$py")/tensorboard" --logdir runs --host 127.0.0.1 --port 6199 >/dev/null 2>&1 &
tb=$!
for _ in $(seq 60); do curl -sf http://127.0.0.1:6199/ >/dev/null && break; sleep 0.5; done
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$work/chromium" --hide-scrollbars --window-size=1500,1100 \
    --virtual-time-budget=15000 --screenshot="$repo/docs/images/tensorboard.png" \
    "http://127.0.0.1:6199/#scalars&tagFilter=loss%7Ctokens_per_s%7Cutil_pct%7Cpower_w&_smoothingWeight=0" 2>/dev/null
echo "wrote $repo/docs/images/tensorboard.png"

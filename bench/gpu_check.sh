#!/usr/bin/env bash
# The one script to run wherever a GPU is: `pytest -m gpu` and `gpuwatch selftest --json`.
# Usage: bash bench/gpu_check.sh OUTDIR   (writes OUTDIR/pytest-gpu.txt and OUTDIR/selftest.json)
# Uses ./.venv if `bash dev.sh test` made one; otherwise the python3 that has torch (e.g. a
# CUDA build already on the GPU machine), installing gpuwatch into it without network access.
set -u
out=${1:?usage: bash bench/gpu_check.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=$(command -v python3); fi
echo "== python: $py"
"$py" -c 'import torch; print("== torch", torch.__version__, "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())' \
  || echo "== torch is not importable here: the CUDA checks will say skipped"
if ! "$py" -c 'import gpuwatch.cli' 2>/dev/null || [ ! -x "$(dirname "$py")/gpuwatch" ]; then
  echo "== installing gpuwatch (editable, no dependencies, no build isolation: works offline)"
  "$py" -m pip install -q --no-deps --no-build-isolation -e . || echo "== install failed; continuing"
fi
gw="$(dirname "$py")/gpuwatch"
nvidia-smi -L 2>&1 | sed 's/^/== /'
echo "== 1/2: $py -m pytest -m gpu -v   (timeout 420 s)"
timeout 420 "$py" -m pytest -m gpu -v -p no:cacheprovider 2>&1 | tee "$out/pytest-gpu.txt" | tail -40
echo "== 2/2: $gw selftest --json   (timeout 300 s)"
timeout 300 "$gw" selftest --json >"$out/selftest.json" 2>"$out/selftest-progress.txt"
rc=$?
echo "== selftest exit code $rc; results:"
"$py" -c 'import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["status"].ljust(8), r["check"] + ":", r["detail"])' "$out/selftest.json" \
  || cat "$out/selftest-progress.txt"

#!/usr/bin/env bash
# The one script to run wherever a GPU is: `pytest -m gpu` and `gpuwatch selftest --json`.
# Usage: bash bench/gpu_check.sh OUTDIR   (writes OUTDIR/pytest-gpu.txt and OUTDIR/selftest.json)
# Python: $PYTHON if set, else the first of ./.venv, python3, python whose torch sees a GPU (a CUDA
# build already on the GPU machine wins over a CPU-only .venv), else ./.venv or python3; gpuwatch is
# installed into it without network access. selftest runs first; both fit a 10-minute limit
# (300 s + 240 s). Exit status 0 only when both passed.
set -u
out=${1:?usage: bash bench/gpu_check.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
py=${PYTHON:-}
if [ -z "$py" ]; then
  for cand in .venv/bin/python python3 python; do
    command -v "$cand" >/dev/null 2>&1 || continue
    if "$cand" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then py=$cand; break; fi
  done
fi
if [ -z "$py" ]; then if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=$(command -v python3); fi; fi
echo "== python: $py"
"$py" -c 'import torch; print("== torch", torch.__version__, "CUDA", torch.version.cuda, "available:", torch.cuda.is_available())' \
  || echo "== torch is not importable here: the CUDA checks will say skipped"
if ! "$py" -c 'import gpuwatch.cli' 2>/dev/null || [ ! -x "$(dirname "$py")/gpuwatch" ]; then
  echo "== installing gpuwatch (editable, no dependencies, no build isolation: works offline)"
  "$py" -m pip install -q --no-deps --no-build-isolation -e . || echo "== install failed; continuing"
fi
gw="$(dirname "$py")/gpuwatch"
nvidia-smi -L 2>&1 | sed 's/^/== /'
"$py" -c 'import importlib.util as u
missing = [m for m in ("click", "psutil", "pynvml", "textual", "prometheus_client", "pytest") if not u.find_spec(m)]
print("== missing modules (their checks fail or skip):", " ".join(missing) if missing else "none")'
echo "== 1/2: $gw selftest --json   (timeout 300 s)"
timeout 300 "$gw" selftest --json >"$out/selftest.json" 2>"$out/selftest-progress.txt"
rc_selftest=$?
echo "== selftest exit code $rc_selftest$([ $rc_selftest = 124 ] && echo ' (timed out)'); results:"
"$py" -c 'import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["status"].ljust(8), r["check"] + ":", r["detail"])' "$out/selftest.json" \
  || cat "$out/selftest-progress.txt"
# The full selftest just ran: its pytest wrapper would run it a second time.
again=tests/test_selftest.py::test_selftest_on_a_real_gpu_has_no_failures
echo "== 2/2: $py -m pytest -m gpu -v --deselect $again   (timeout 240 s)"
timeout 240 "$py" -m pytest -m gpu -v -p no:cacheprovider --deselect "$again" 2>&1 | tee "$out/pytest-gpu.txt" | tail -40
rc_pytest=${PIPESTATUS[0]}
echo "== pytest exit code $rc_pytest$([ $rc_pytest = 124 ] && echo ' (timed out)'); outputs: $out/selftest.json $out/selftest-progress.txt $out/pytest-gpu.txt"
[ "$rc_selftest" = 0 ] && [ "$rc_pytest" = 0 ]

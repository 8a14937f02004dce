#!/usr/bin/env bash
# The one script to run wherever an NVIDIA GPU is available:
#   bash bench/gpu_check.sh OUT_DIR
# Runs `gpuwatch selftest --json` and `pytest -m gpu`, writing both outputs (and the machine's
# facts) to OUT_DIR. Meant to run unattended on a fresh machine in under 10 minutes: it uses the
# torch already installed there (set PYTHON=/path/to/python to choose the interpreter), installs
# gpuwatch's own dependencies only if they are missing and pip can reach an index, and otherwise
# runs from the source tree with what is importable. Every step says what it runs; the exit status
# is 0 only when both the selftest and the GPU tests passed.
set -u
OUT=${1:?usage: bash bench/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
say() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/summary.txt"; }

# -- the interpreter: $PYTHON, else one whose torch sees a GPU, else one with torch, else python3 ---
pick_python() {
  local py
  [ -n "${PYTHON:-}" ] && { echo "$PYTHON"; return; }
  for py in "$REPO/.venv/bin/python" python3 python /usr/bin/python3 /opt/conda/bin/python; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      echo "$py"; return
    fi
  done
  for py in "$REPO/.venv/bin/python" python3 python; do
    command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' 2>/dev/null && { echo "$py"; return; }
  done
  for py in python3 python; do
    command -v "$py" >/dev/null 2>&1 && { echo "$py"; return; }
  done
}
PY=$(pick_python)
[ -n "$PY" ] || { say "no python found"; exit 2; }
say "python: $(command -v "$PY") ($("$PY" -V 2>&1))"
{
  echo "== nvidia-smi"; nvidia-smi 2>&1 || echo "(nvidia-smi failed)"
  echo "== nvidia-smi -L"; nvidia-smi -L 2>&1
  echo "== torch"; "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else "")' 2>&1
  echo "== git"; git -C "$REPO" log -1 --oneline 2>&1
} > "$OUT/machine.txt"
say "machine facts -> $OUT/machine.txt; torch: $("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"

# -- gpuwatch's dependencies, keeping the machine's torch ------------------------------------------
missing=$("$PY" - <<'EOF'
import importlib.util
need = ["click", "psutil", "pynvml", "sqlite_utils", "textual", "prometheus_client", "pytest"]
print(" ".join(m for m in need if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
  # A venv that sees the machine's own packages (its torch above all); nothing global changes.
  VENV="${TMPDIR:-/tmp}/gpuwatch-gpu-check-venv"
  say "missing modules: $missing; installing gpuwatch into $VENV (system site-packages visible, torch pinned, 90 s at most)"
  TORCH_V=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)
  CONSTRAINTS="$OUT/constraints.txt"
  : > "$CONSTRAINTS"
  [ -n "$TORCH_V" ] && echo "torch==$TORCH_V" > "$CONSTRAINTS"
  if "$PY" -m venv --system-site-packages "$VENV" > "$OUT/pip.txt" 2>&1 &&
     timeout 90 "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" -e "$REPO" pytest pytest-timeout >> "$OUT/pip.txt" 2>&1; then
    PY="$VENV/bin/python"
    say "installed; python is now $PY"
  else
    say "install failed (offline?), see $OUT/pip.txt; running from the source tree with what is importable"
  fi
fi

GPUWATCH=("$PY" -c 'import sys; from gpuwatch.cli import main; sys.argv[0] = "gpuwatch"; main()')

# -- 1. gpuwatch selftest --json (the whole run: <= 5 min on one H100/H200) ---------------------------
say "running: gpuwatch selftest --json  (stdout -> selftest.json, progress -> selftest.log; limit 300 s)"
timeout 300 "${GPUWATCH[@]}" selftest --json > "$OUT/selftest.json" 2> "$OUT/selftest.log"
SELFTEST_RC=$?
say "gpuwatch selftest exit status $SELFTEST_RC$([ $SELFTEST_RC = 124 ] && echo ' (timed out)')"
"$PY" - "$OUT/selftest.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    got = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"  (no JSON result: {e})")
    raise SystemExit
for c in got["checks"]:
    print(f"  {c['status']:8} {c['name']}: {c['detail']}")
EOF

# -- 2. pytest -m gpu ----------------------------------------------------------------------------------
say "running: $PY -m pytest -m gpu -q -rs tests  (-> pytest-gpu.txt, pytest-gpu.xml; limit 180 s)"
timeout 180 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$OUT/pytest-gpu.xml" tests > "$OUT/pytest-gpu.txt" 2>&1
PYTEST_RC=$?
say "pytest -m gpu exit status $PYTEST_RC$([ $PYTEST_RC = 124 ] && echo ' (timed out)'): $(tail -1 "$OUT/pytest-gpu.txt")"

say "outputs in $OUT: summary.txt machine.txt selftest.json selftest.log pytest-gpu.txt pytest-gpu.xml"
[ $SELFTEST_RC = 0 ] && [ $PYTEST_RC = 0 ]

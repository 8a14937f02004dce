#!/usr/bin/env bash
# One-step set-up and run: `bash dev.sh demo` or `bash dev.sh test [pytest args]`.
# Contributors: `bash dev.sh lint` (ruff, formatting, mypy, import contracts), `bash dev.sh fmt`,
# `bash dev.sh docs [serve]` (the MkDocs site, built strictly), `bash dev.sh screenshots`.
# Makes ./.venv if missing, installs gpuwatch with its extras (CPU torch 2.13.0), then runs.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/gpuwatch ] || [ pyproject.toml -nt .venv/.installed ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # The CPU build; a bare `torch` requirement could pull a multi-GB CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[torch,dev]"
  # transformers and lightning must not swap the CPU build for a CUDA one.
  .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__ != "2.13.0+cpu" and f"torch was replaced: {torch.__version__}")'
  touch .venv/.installed
fi
what=${1:-demo}
shift || true
case "$what" in
  demo) exec .venv/bin/gpuwatch demo "$@" ;;
  # Two workers more than the cores (a third of the suite's time is tests waiting on a server's
  # cadence: those cores go to other workers), each handed a whole test file at a time, the
  # longest files first (tests/conftest.py orders them by their `slow` marks). `-n 0`: one
  # process. Byte-code is written (whatever PYTHONDONTWRITEBYTECODE says): the hundreds of
  # gpuwatch processes the tests start would otherwise each compile our modules again.
  test)
    unset PYTHONDONTWRITEBYTECODE
    exec .venv/bin/python -m pytest -q -n "$(($(nproc) + 2))" --dist loadscope --no-loadscope-reorder "$@" ;;
  lint)
    export PATH="$PWD/.venv/bin:$PATH"
    ruff check .
    mypy
    lint-imports
    ruff format --check . ;;
  fmt) exec .venv/bin/ruff format "$@" ;;
  docs)
    if [ "${1:-build}" = serve ]; then exec .venv/bin/mkdocs serve; fi
    exec .venv/bin/mkdocs build --strict ;;
  screenshots) exec .venv/bin/python tools/screenshots.py docs/img "$@" ;;
  *) echo "usage: bash dev.sh demo|test|lint|fmt|docs [serve]|screenshots [args]" >&2; exit 2 ;;
esac

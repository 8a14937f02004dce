"""Reference long-sequence PyTorch workloads, instrumented through the public gpuwatch client API.

Each module runs as `python -m workloads.NAME --help`: seconds on a CPU with `--tiny`, and scales
by flags on a GPU. They are examples to copy, load for the monitor, and the subject of
capacity studies (`gpt_train` prints a machine-readable `GPUWATCH_RESULT` line).
"""

"""What every workload shares: flags, device and precision choice, peak memory, the summary lines."""

from __future__ import annotations

import argparse
import contextlib
import json
import resource

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
RESULT_PREFIX = "GPUWATCH_RESULT "


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="autocast precision for the forward pass (default fp32)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed for weights and data")
    parser.add_argument("--name", default=None, help="run name shown by gpuwatch (default: the workload's)")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="small size defaults that run in seconds on a CPU (size flags you give still win)",
    )


def add_size_args(parser: argparse.ArgumentParser, sizes: dict) -> None:
    """Size flags with two defaults: {dest: (type, default, tiny default, help)}.

    A flag the user gives always wins; otherwise --tiny picks the tiny default."""
    for dest, (kind, default, tiny, text) in sizes.items():
        parser.add_argument(
            "--" + dest.replace("_", "-"),
            dest=dest,
            type=kind,
            default=None,
            help=f"{text} (default {default}; with --tiny {tiny})",
        )
    parser.set_defaults(_sizes=sizes)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    for dest, (_, default, tiny, _) in args._sizes.items():
        if getattr(args, dest) is None:
            setattr(args, dest, tiny if args.tiny else default)
        if getattr(args, dest) <= 0:
            parser.error(f"--{dest.replace('_', '-')} must be positive, got {getattr(args, dest)}")
    del args._sizes
    return args


def resolve_device(requested: str | None) -> torch.device:
    """The device to run on; asking for CUDA where there is none is an error, not a silent fallback."""
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise SystemExit(f"error: --device {requested!r} is not a device (try cpu, cuda, cuda:1)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(
                "error: --device cuda asked for, but torch.cuda.is_available() is False "
                "(no driver, no GPU visible, or a CPU-only torch build)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise SystemExit(f"error: --device {requested}: only {torch.cuda.device_count()} GPU(s) visible")
    return device


def readiness(device: torch.device) -> str:
    """The articles' readiness check, as one line: is CUDA usable, and what runs the work."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return (
            f"CUDA available: True; using {device} = {torch.cuda.get_device_name(index)} "
            f"(torch {torch.__version__}, CUDA {torch.version.cuda})"
        )
    return f"CUDA available: {torch.cuda.is_available()}; using CPU (torch {torch.__version__})"


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(device: torch.device, precision: str):
    """Mixed precision for the forward pass; fp32 means no autocast at all."""
    dtype = autocast_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so wall-clock timings measure the work, not the launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> int:
    """Peak memory of this process: CUDA allocator peak on a GPU, peak RSS on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # VmHWM, this program's own high-water mark. Not ru_maxrss: Linux carries the launching
    # process's peak across exec into it, so a workload started by a big process (a test
    # runner, a notebook) would report that process's peak at every sequence length.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def peak_label(device: torch.device) -> str:
    return "CUDA max allocated" if device.type == "cuda" else "peak RSS"


def human_bytes(n: float) -> str:
    # Workloads see only the public client API, so not gpuwatch.base.fmt.
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # unreachable; keeps type checkers quiet


def print_result(**fields) -> None:
    """The last line of output, for programs that run a workload and parse what it measured."""
    print(RESULT_PREFIX + json.dumps(fields, sort_keys=True), flush=True)


def parse_result(output: str) -> dict:
    """The fields of the last GPUWATCH_RESULT line in a workload's output."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    raise ValueError("no GPUWATCH_RESULT line in the workload's output")

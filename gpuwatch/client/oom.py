"""OOM postmortems: what was asked for, what was free, who else held memory, and where it failed.

Captured in the dying process, so everything here is cheap and never synchronises the GPU:
allocator counters and NVML are host-side reads. The GPU figures come from a `torch.cuda`-like
provider passed in (the real `torch.cuda`, or a fake in tests), so one code path serves both.

Phase heuristic (documented for users): the traceback's frames say where it failed — a frame
inside torch.autograd's backward means 'backward', one inside torch.optim means 'optimizer',
anything else 'forward'. No per-module hooks are installed for it.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import resource
import sys
import traceback as traceback_mod
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from gpuwatch.base.config import Config
from gpuwatch.base.diskfull import free_bytes, no_space, show_bytes

log = logging.getLogger(__name__)

TRACEBACK_MAX_CHARS = 20000
SUMMARY_MAX_CHARS = 30000
TOP_BLOCKS = 10
STACK_FRAMES = 12
SNAPSHOT_NAME = "oom_snapshot.pickle"

_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_CUDA_REQUEST = re.compile(r"Tried to allocate ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_HOST_REQUEST = re.compile(r"tried to allocate (\d+) bytes")
# Stats worth a column-like place in stats_json (memory_stats() has hundreds of keys).
_KEY_STATS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
)

# Filled by the allocator's OOM observer at the moment of failure: {device: (requested, allocated, free)}.
_observed: dict[int, tuple[int, int, int]] = {}
_observer_attached = False


def requested_bytes_from_message(message: str) -> int | None:
    """The size the allocator was asked for, from a CUDA ('Tried to allocate 2.00 GiB') or CPU message."""
    found = _HOST_REQUEST.search(message)
    if found:
        return int(found.group(1))
    found = _CUDA_REQUEST.search(message)
    if found:
        return int(float(found.group(1)) * _UNITS[found.group(2)])
    return None


def phase_of(tb: TracebackType | None) -> str:
    """forward | backward | optimizer, from the frames the exception passed through."""
    frames = [(f.filename.replace(os.sep, "/"), f.name) for f in traceback_mod.extract_tb(tb)]
    if any("torch/autograd" in path and "backward" in name for path, name in frames):
        return "backward"
    if any("/torch/optim/" in path for path, _ in frames):
        return "optimizer"
    return "forward"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


# ---- GPU --------------------------------------------------------------------------------------


def attach_observer(torch: ModuleType) -> None:
    """Record the allocator's own figures when it gives up (once per process; it cannot detach)."""
    global _observer_attached
    if _observer_attached:
        return

    def observe(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        # Called inside the allocator: only remember numbers, never call back into torch.
        _observed[int(device)] = (int(alloc), int(device_allocated), int(device_free))

    torch._C._cuda_attach_out_of_memory_observer(observe)
    _observer_attached = True


def start_history(cuda: Any, entries: int) -> None:
    """Keep the last `entries` allocations with Python stacks (config record_memory_history)."""
    cuda.memory._record_memory_history(max_entries=entries, stacks="python")


def _largest_blocks(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """The biggest live blocks and the Python stacks that allocated them (if history was on)."""
    blocks = [
        b
        for seg in snapshot.get("segments", [])
        for b in seg.get("blocks", [])
        if b.get("state") == "active_allocated"
    ]
    blocks.sort(key=lambda b: b.get("size", 0), reverse=True)
    return [
        {
            "size_bytes": int(b.get("size", 0)),
            "stack": [
                f"{f.get('filename')}:{f.get('line')} {f.get('name')}"
                for f in b.get("frames", [])[:STACK_FRAMES]
            ],
        }
        for b in blocks[:TOP_BLOCKS]
    ]


def gpu_figures(
    exc: BaseException, cuda: Any, device: int | None = None, snapshot_dir: Path | None = None
) -> dict[str, Any]:
    """Postmortem fields for a CUDA OOM, read from `cuda` (torch.cuda or a fake with its API)."""
    device = cuda.current_device() if device is None else device
    requested, _, observed_free = _observed.pop(device, (None, None, None))
    fields: dict[str, Any] = {
        "oom_kind": "gpu",
        "device": device,
        "requested_bytes": requested or requested_bytes_from_message(str(exc)),
    }
    try:
        free, total = cuda.mem_get_info(device)  # cudaMemGetInfo: a driver query, no stream sync
        fields.update(free_bytes=int(free), total_bytes=int(total))
    except Exception:
        log.warning("gpuwatch: could not read free GPU memory", exc_info=True)
        fields["free_bytes"] = observed_free
    stats = cuda.memory_stats(device)
    fields.update(
        allocated_bytes=stats.get("allocated_bytes.all.current"),
        reserved_bytes=stats.get("reserved_bytes.all.current"),
        stats={k: stats.get(k) for k in _KEY_STATS if stats.get(k) is not None},
    )
    fields["memory_summary"] = _tail(cuda.memory_summary(device), SUMMARY_MAX_CHARS)
    snapshot = cuda.memory._snapshot()
    if any(
        seg.get("blocks") and any(b.get("frames") for b in seg["blocks"])
        for seg in snapshot.get("segments", [])
    ):
        fields["largest_blocks"] = _largest_blocks(snapshot)
        if snapshot_dir is not None:
            fields["snapshot_path"] = _save_snapshot(snapshot, snapshot_dir)
    return fields


def _save_snapshot(snapshot: dict[str, Any], directory: Path) -> str | None:
    """The snapshot as pytorch.org/memory_viz opens it (what torch's _dump_snapshot writes)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SNAPSHOT_NAME
        with open(path, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
        return str(path)
    except OSError as e:
        if no_space(e):  # one line, no traceback: the postmortem itself still goes out
            log.warning(
                "gpuwatch: could not save the memory snapshot in %s: %s; %s bytes free there",
                directory,
                e.strerror,
                show_bytes(free_bytes(directory)),
            )
        else:
            log.warning("gpuwatch: could not save the memory snapshot in %s", directory, exc_info=True)
        return None


def nvml_view(
    nvml_index: int, own_pid: int, nvml: Any = None
) -> tuple[list[dict[str, Any]], dict[str, int]] | None:
    """(every other process holding memory on that GPU, free bytes per GPU) from NVML; None if
    NVML can't be read here (the daemon then fills the neighbours from its own samples)."""
    from collectors.nvml import NvmlCollector, NvmlUnavailable

    try:
        collector = NvmlCollector(nvml)
        try:
            gpus, processes = collector.sample(0)
        finally:
            collector.close()
    except NvmlUnavailable:
        return None
    found = [
        {"pid": p.pid, "user": _user_of(p.pid), "used_mem_bytes": p.used_mem_bytes}
        for p in processes
        if p.gpu_index == nvml_index and p.pid != own_pid
    ]
    found.sort(key=lambda n: n["used_mem_bytes"] or 0, reverse=True)
    return found, {str(g.gpu_index): g.mem_free_bytes for g in gpus if g.mem_free_bytes is not None}


def nvml_index_of(device: int) -> int:
    """NVML's index of torch's device `device` (CUDA_VISIBLE_DEVICES renumbers; NVML does not)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device < len(visible) and visible[device].isdigit():
        return int(visible[device])
    return device  # unset, or given as UUIDs: the daemon maps those from the run's gpu_uuids


def _user_of(pid: int) -> str | None:
    import psutil

    try:
        user: str = psutil.Process(pid).username()
        return user
    except (psutil.Error, KeyError):  # gone, hidden by the pid namespace, or a uid without a name
        return None


# ---- host -------------------------------------------------------------------------------------


def host_figures(exc: BaseException) -> dict[str, Any]:
    """Postmortem fields for a host OOM (MemoryError or torch's DefaultCPUAllocator failure)."""
    import psutil

    from collectors.host import cgroup_memory_limit_bytes

    memory = psutil.virtual_memory()
    own = psutil.Process().memory_info()
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return {
        "oom_kind": "host",
        "requested_bytes": requested_bytes_from_message(str(exc)),
        "rss_bytes": own.rss,
        "available_bytes": memory.available,
        "total_bytes": memory.total,
        "cgroup_limit_bytes": cgroup_memory_limit_bytes(),
        # RLIMIT_AS bounds address space (VMS), not RSS: both go along.
        "stats": {
            "vms_bytes": own.vms,
            **({"rlimit_as_bytes": soft} if soft != resource.RLIM_INFINITY else {}),
        },
    }


def is_gpu_oom(exc: BaseException) -> bool:
    return "CUDA out of memory" in str(exc) or (
        type(exc).__name__ == "OutOfMemoryError" and "DefaultCPUAllocator" not in str(exc)
    )


# ---- the whole postmortem -------------------------------------------------------------------


def postmortem(
    exc: BaseException,
    *,
    run_dir: Path | None,
    step: int | None,
    seq_len: int | None,
    batch: int | None,
    config: dict[str, Any] | None,
    cuda: Any = None,
    nvml: Any = None,
) -> dict[str, Any]:
    """All fields of one oom_postmortem event (advice included). `cuda`: torch.cuda or a fake."""
    from gpuwatch.client import oom_advice

    if cuda is not None and is_gpu_oom(exc):
        fields = gpu_figures(exc, cuda, snapshot_dir=run_dir)
        view = nvml_view(nvml_index_of(fields["device"]), os.getpid(), nvml)
        if view is not None:
            fields["neighbours"], fields["stats"]["gpu_free_bytes"] = view
    else:
        fields = host_figures(exc)
    fields.update(
        step=step,
        seq_len=seq_len,
        batch=batch,
        phase=phase_of(exc.__traceback__),
        error_message=str(exc)[:2000],
        traceback=_tail(
            "".join(traceback_mod.format_exception(type(exc), exc, exc.__traceback__)), TRACEBACK_MAX_CHARS
        ),
    )
    fields["advice"] = [a.as_dict() for a in oom_advice.advise(fields, config or {})]
    return fields


# ---- the run's side ---------------------------------------------------------------------------


def _cuda_module() -> ModuleType | None:
    """torch if this workload uses CUDA (without importing torch ourselves), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch


def prepare(cfg: Config) -> None:
    """At track() start: catch the allocator's figures at the moment of failure, and record the
    allocation history if configured (record_memory_history; costs step time, gives the stacks)."""
    torch = _cuda_module()
    if torch is None:
        return
    try:
        attach_observer(torch)
        if cfg.record_memory_history:
            start_history(torch.cuda, cfg.memory_history_entries)
    except Exception:  # an older torch without the hooks still gets the rest of the postmortem
        log.warning("gpuwatch: OOM observer / memory history unavailable", exc_info=True)


def capture(exc: BaseException, cfg: Config, run_id: str, **context: Any) -> dict[str, Any]:
    """The postmortem of `exc` in this process (step, seq_len, batch, config in `context`)."""
    torch = _cuda_module()
    cuda = torch.cuda if torch is not None and torch.cuda.is_initialized() else None
    return postmortem(exc, run_dir=cfg.runs_path / run_id, cuda=cuda, **context)

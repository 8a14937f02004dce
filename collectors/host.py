"""The host around the GPUs (CPU, memory, disk, network, /dev/shm) from psutil, and the cgroup
memory limit and OOM-kill count that the OOM postmortem quotes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_ROOT = Path("/proc")
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX rounded to a page (9223372036854771712).
_V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class HostSample:
    """One tick of the host; the columns of `host_samples`. Disk and net are cumulative."""
    ts_ms: int
    cpu_pct: float | None
    load1: float
    load5: float
    load15: float
    mem_total_bytes: int
    mem_used_bytes: int
    mem_available_bytes: int
    swap_used_bytes: int
    disk_read_bytes: int | None
    disk_write_bytes: int | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    shm_total_bytes: int | None
    shm_used_bytes: int | None


def _busy_and_total(t) -> tuple[float, float]:
    # On Linux guest time is already inside user/nice; count it once, as psutil does.
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


class HostCollector:
    """Samples the host without blocking: CPU % is the busy share since the previous sample."""

    def __init__(self, shm_path: str = "/dev/shm"):
        self.shm_path = shm_path
        # Our own baseline rather than psutil.cpu_percent's, which is kept per calling thread.
        self._last_cpu = _busy_and_total(psutil.cpu_times())

    def _cpu_pct(self) -> float | None:
        busy, total = _busy_and_total(psutil.cpu_times())
        last_busy, last_total = self._last_cpu
        self._last_cpu = (busy, total)
        if total <= last_total:
            return None  # called twice within one clock tick of the kernel's counters
        return round(min(100.0, max(0.0, 100.0 * (busy - last_busy) / (total - last_total))), 1)

    def sample(self, ts_ms: int) -> HostSample:
        load1, load5, load15 = psutil.getloadavg()
        vm = psutil.virtual_memory()
        disk = psutil.disk_io_counters()  # None where the kernel shows no disks (containers)
        nics = psutil.net_io_counters(pernic=True)
        # Loopback traffic never leaves the machine; leave it out of network totals.
        net = [c for name, c in nics.items() if name != "lo"]
        try:
            shm = psutil.disk_usage(self.shm_path)
        except OSError:
            shm = None
        return HostSample(
            ts_ms=ts_ms,
            cpu_pct=self._cpu_pct(),
            load1=load1, load5=load5, load15=load15,
            mem_total_bytes=vm.total,
            mem_used_bytes=vm.used,
            mem_available_bytes=vm.available,
            swap_used_bytes=psutil.swap_memory().used,
            disk_read_bytes=disk.read_bytes if disk else None,
            disk_write_bytes=disk.write_bytes if disk else None,
            net_rx_bytes=sum(c.bytes_recv for c in net) if net else None,
            net_tx_bytes=sum(c.bytes_sent for c in net) if net else None,
            shm_total_bytes=shm.total if shm else None,
            shm_used_bytes=shm.used if shm else None,
        )


# -- cgroups ------------------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _memory_cgroup(pid: int | None, root: Path, proc: Path) -> tuple[int, Path] | None:
    """(cgroup version, directory) of the memory controller for pid (default: this process)."""
    text = _read(proc / (str(pid) if pid else "self") / "cgroup")
    if text is None:
        return None
    unified = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            v1 = root / "memory" / path.lstrip("/")
            # Inside a container the mount shows only its own cgroup, at the mount's root.
            return 1, v1 if v1.is_dir() else root / "memory"
        if hid == "0" and controllers == "":
            unified = path
    if unified is None:
        return None
    v2 = root / unified.lstrip("/")
    return 2, v2 if v2.is_dir() else root


def cgroup_memory_limit_bytes(pid: int | None = None, *, root: Path = CGROUP_ROOT,
                              proc: Path = PROC_ROOT) -> int | None:
    """The memory limit that binds pid (default: this process), or None if unlimited/unknown.

    cgroup v2: the smallest memory.max from the process's cgroup up to the root, since a
    parent slice's limit binds its children too. v1: hierarchical_memory_limit in memory.stat.
    """
    found = _memory_cgroup(pid, root, proc)
    if found is None:
        return None
    version, directory = found
    if version == 1:
        stat = _read(directory / "memory.stat") or ""
        limits = [int(line.split()[1]) for line in stat.splitlines()
                  if line.startswith("hierarchical_memory_limit ")]
        if not limits:
            raw = (_read(directory / "memory.limit_in_bytes") or "").strip()
            limits = [int(raw)] if raw.isdigit() else []
        return limits[0] if limits and limits[0] < _V1_UNLIMITED else None
    limits = []
    for d in [directory, *directory.parents]:
        raw = (_read(d / "memory.max") or "").strip()
        if raw.isdigit():
            limits.append(int(raw))
        if d == root:
            break
    return min(limits) if limits else None


def cgroup_oom_kills(pid: int | None = None, *, root: Path = CGROUP_ROOT,
                     proc: Path = PROC_ROOT) -> int | None:
    """How many processes the kernel OOM-killed in pid's memory cgroup; None if unknown."""
    found = _memory_cgroup(pid, root, proc)
    if found is None:
        return None
    version, directory = found
    text = _read(directory / ("memory.oom_control" if version == 1 else "memory.events"))
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None

"""The host around the GPUs (CPU, memory, swapping, page cache, disk, network, /dev/shm) with
psutil's definitions, and the cgroup memory limit and OOM-kill count that the OOM postmortem
quotes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_ROOT = Path("/proc")
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX rounded to a page (9223372036854771712).
_V1_UNLIMITED = 2**62
_READ_SIZE = 65536
_PAGE = os.sysconf("SC_PAGE_SIZE")


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
    swap_in_bytes: int | None  # cumulative: pages swapped in / out since boot, in bytes
    swap_out_bytes: int | None
    page_cache_bytes: int | None  # Cached + SReclaimable, psutil's (and free's) "cached"


class _ProcFile:
    """A /proc file kept open and re-read from offset 0: one syscall a tick, not three.

    read() returns None if the file does not exist here (e.g. /proc/diskstats in a container).
    """

    def __init__(self, path: Path):
        try:
            self._file = open(path, "rb", buffering=0)  # closed with the collector, or by GC
        except OSError:
            self._file = None

    def read(self) -> bytes | None:
        if self._file is None:
            return None
        chunks, offset, fd = [], 0, self._file.fileno()
        while True:  # the kernel regenerates the text on each read from offset 0
            chunk = os.pread(fd, _READ_SIZE, offset)
            chunks.append(chunk)
            offset += len(chunk)
            if len(chunk) < _READ_SIZE:  # seq_file fills the buffer unless at the end
                return b"".join(chunks)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _busy_and_total(proc_stat: bytes) -> tuple[int, int]:
    """Busy and total clock ticks of all CPUs from the first line of /proc/stat."""
    ticks = [int(v) for v in proc_stat[: proc_stat.index(b"\n")].split()[1:]]
    ticks += [0] * (10 - len(ticks))
    user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice = ticks[:10]
    # On Linux guest time is already inside user/nice; count it once, as psutil does.
    total = sum(ticks[:10]) - guest - guest_nice
    return total - idle - iowait, total


_MEMINFO_KEYS = (b"MemTotal:", b"MemAvailable:", b"SwapTotal:", b"SwapFree:", b"Cached:", b"SReclaimable:")


def _meminfo(text: bytes) -> dict[bytes, int]:
    """The /proc/meminfo lines we use, in bytes (found, not every line split: a tick's work)."""
    text = b"\n" + text
    out = {}
    for key in _MEMINFO_KEYS:
        at = text.find(b"\n" + key)  # at a line's start: "Cached:" is not "SwapCached:"
        if at >= 0:
            start = at + 1 + len(key)
            end = text.find(b"\n", start)
            out[key] = int((text[start:end] if end >= 0 else text[start:]).split()[0]) * 1024
    return out


def _swap_in_out(vmstat: bytes | None) -> tuple[int | None, int | None]:
    """Bytes swapped in and out since boot, from /proc/vmstat's pswpin/pswpout page counts."""
    found = []
    for key in (b"\npswpin ", b"\npswpout "):
        at = (vmstat or b"").find(key)
        if at < 0:
            return None, None
        start = at + len(key)
        found.append(int(vmstat[start : vmstat.index(b"\n", start)]) * _PAGE)
    return found[0], found[1]


class HostCollector:
    """Samples the host without blocking: CPU % is the busy share since the previous sample.

    Reads /proc/stat, /proc/meminfo, /proc/diskstats and /proc/net/dev through handles kept
    open (opening files is most of what psutil spends here), with psutil's definitions:
    used memory = total - available, disk bytes = 512-byte sectors of whole disks (partitions
    are inside their disk), network bytes of every interface but loopback.
    """

    def __init__(self, shm_path: str = "/dev/shm", proc: Path = PROC_ROOT):
        self.shm_path = shm_path
        self._stat = _ProcFile(proc / "stat")
        self._meminfo = _ProcFile(proc / "meminfo")
        self._diskstats = _ProcFile(proc / "diskstats")
        self._netdev = _ProcFile(proc / "net" / "dev")
        self._vmstat = _ProcFile(proc / "vmstat")
        self._is_disk: dict[bytes, bool] = {}  # device name -> is a whole disk (/sys/block/NAME)
        # Our own baseline rather than psutil.cpu_percent's, which is kept per calling thread.
        self._last_cpu = _busy_and_total(self._stat.read())

    def close(self) -> None:
        for f in (self._stat, self._meminfo, self._diskstats, self._netdev, self._vmstat):
            f.close()

    def _cpu_pct(self) -> float | None:
        busy, total = _busy_and_total(self._stat.read())
        last_busy, last_total = self._last_cpu
        self._last_cpu = (busy, total)
        if total <= last_total:
            return None  # called twice within one clock tick of the kernel's counters
        return round(min(100.0, max(0.0, 100.0 * (busy - last_busy) / (total - last_total))), 1)

    def _memory(self) -> tuple[int, int, int, int, int | None]:
        """(total, used, available, swap used, page cache) bytes."""
        mem = _meminfo(self._meminfo.read() or b"")
        total, avail = mem.get(b"MemTotal:"), mem.get(b"MemAvailable:")
        if not total or not avail or avail > total:  # old kernels, kernel bugs, LXC: psutil's way
            vm, swap = psutil.virtual_memory(), psutil.swap_memory()
            return vm.total, vm.used, vm.available, swap.used, vm.cached
        cached = mem.get(b"Cached:")
        return (
            total,
            total - avail,
            avail,
            mem.get(b"SwapTotal:", 0) - mem.get(b"SwapFree:", 0),
            None if cached is None else cached + mem.get(b"SReclaimable:", 0),
        )

    def _disk_bytes(self) -> tuple[int | None, int | None]:
        text = self._diskstats.read()
        read = written = 0
        found = False
        for line in (text or b"").splitlines():
            head = line.split(None, 3)  # major, minor, name, the counters: split them for disks only
            if len(head) < 4:
                continue
            name = head[2]
            is_disk = self._is_disk.get(name)
            if is_disk is None:
                is_disk = self._is_disk[name] = os.path.exists(b"/sys/block/" + name.replace(b"/", b"!"))
            if not is_disk:
                continue
            fields = line.split()
            if len(fields) < 14:  # a partition line of old kernels
                continue
            found = True
            read += int(fields[5]) * 512
            written += int(fields[9]) * 512
        return (read, written) if found else (None, None)

    def _net_bytes(self) -> tuple[int | None, int | None]:
        text = self._netdev.read()
        rx = tx = 0
        found = False
        for line in (text or b"").splitlines()[2:]:
            name, _, counters = line.rpartition(b":")
            # Loopback traffic never leaves the machine; leave it out of network totals.
            if name.strip() == b"lo":
                continue
            fields = counters.split(None, 9)  # rx bytes, ..., tx bytes: the rest unsplit
            found = True
            rx += int(fields[0])
            tx += int(fields[8])
        return (rx, tx) if found else (None, None)

    def sample(self, ts_ms: int) -> HostSample:
        load1, load5, load15 = os.getloadavg()
        total, used, avail, swap_used, page_cache = self._memory()
        swap_in, swap_out = _swap_in_out(self._vmstat.read())
        disk_read, disk_write = self._disk_bytes()  # None where the kernel shows no disks
        net_rx, net_tx = self._net_bytes()
        try:
            shm = os.statvfs(self.shm_path)
        except OSError:
            shm = None
        return HostSample(
            ts_ms=ts_ms,
            cpu_pct=self._cpu_pct(),
            load1=load1,
            load5=load5,
            load15=load15,
            mem_total_bytes=total,
            mem_used_bytes=used,
            mem_available_bytes=avail,
            swap_used_bytes=swap_used,
            disk_read_bytes=disk_read,
            disk_write_bytes=disk_write,
            net_rx_bytes=net_rx,
            net_tx_bytes=net_tx,
            # psutil.disk_usage's definitions: used = total - free, in fragment-size blocks
            shm_total_bytes=shm.f_blocks * shm.f_frsize if shm else None,
            shm_used_bytes=(shm.f_blocks - shm.f_bfree) * shm.f_frsize if shm else None,
            swap_in_bytes=swap_in,
            swap_out_bytes=swap_out,
            page_cache_bytes=page_cache,
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


def cgroup_memory_limit_bytes(
    pid: int | None = None, *, root: Path = CGROUP_ROOT, proc: Path = PROC_ROOT
) -> int | None:
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
        limits = [
            int(line.split()[1])
            for line in stat.splitlines()
            if line.startswith("hierarchical_memory_limit ")
        ]
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


def cgroup_oom_kills(
    pid: int | None = None, *, root: Path = CGROUP_ROOT, proc: Path = PROC_ROOT
) -> int | None:
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

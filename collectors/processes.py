"""Who a process is (user, command, container, torchrun/Slurm tags) and what it costs the host:
the GPU processes, and every process of the host when the top CPU consumers are looked for.

Any pid may be gone by the time we look, may be a zombie, may belong to another user, or may
not exist in our pid namespace at all (NVML reports host pids; we may run in a container):
each of those reads as None or is skipped, never raised.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Collection, Iterable, NamedTuple

import psutil

PROC_ROOT = Path("/proc")
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)
# docker-<id>.scope, /docker/<id>, cri-containerd-<id>.scope, libpod-<id>.scope, crio-<id>,
# kubepods/.../<id>: all a 64-hex container id in the cgroup path.
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")
_UNIT = re.compile(r"\.(?:scope|service|slice)$")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_STAT_FILES = 4096  # /proc/PID/stat files kept open, at most (a quarter of the limit)
NEW_PIDS_PROBED = 256  # pids handed out since the last walk probed one by one, at most...
LIST_EVERY = 12  # ...and /proc listed at least every this many walks all the same


@dataclass(frozen=True)
class ProcessInfo:
    """Static facts about one process; the columns of `processes` it can know by itself."""

    pid: int
    start_ms: int  # pid + start time name one process across pid reuse
    uid: int | None
    user: str | None
    cmdline: str | None
    container_id: str | None
    slurm_job_id: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    cuda_visible_devices: str | None


def container_id_from_cgroup(text: str) -> str | None:
    """The container id in /proc/PID/cgroup, else the innermost systemd unit, else None."""
    paths = [line.split(":", 2)[2] for line in text.splitlines() if line.count(":") >= 2]
    for path in paths:
        match = _CONTAINER_ID.search(path)
        if match:
            return match.group(1)
    for path in paths:
        units = [part for part in path.split("/") if _UNIT.search(part)]
        if units:
            return units[-1]
    return None


class Usage(NamedTuple):
    """What one process costs the host now."""

    rss_bytes: int
    cpu_pct: float | None  # whole % of one core since the previous look; None at first sight


@dataclass(slots=True)
class _Seen:
    """One process as the latest look at it (walk() or usage()) left it: the CPU % baseline."""

    start_ticks: int  # start time, in clock ticks: another value means the pid was reused
    cpu_ticks: int  # utime + stime
    at: float  # monotonic s of the look
    idle: Usage  # its usage while it does not run: the same RSS, no CPU
    cpu_ns: int  # its process CPU clock when its stat was read (-1: not read)


def _parse_stat(text: bytes) -> tuple[int, int, int] | None:
    """(start time, utime + stime, both in clock ticks; RSS in pages) from /proc/PID/stat.

    None for a zombie (exited, not yet reaped).
    """
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after it.
    fields = text[text.rfind(b")") + 2 :].split(None, 22)  # up to rss; the rest left unsplit
    if len(fields) < 22 or fields[0] == b"Z":
        return None
    # fields[i] is field i + 3 of proc(5): utime 14, stime 15, starttime 22, rss 24.
    return int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[21])


def _cpu_pct(seen: _Seen | None, start_ticks: int, cpu_ticks: int, now: float) -> float | None:
    """Whole % of one core since the look `seen`; None without one, or when the pid now names
    another process (its start time differs)."""
    if seen is None or seen.start_ticks != start_ticks or now <= seen.at:
        return None
    return float(round(100.0 * (cpu_ticks - seen.cpu_ticks) / _CLK_TCK / (now - seen.at)))


def _cpu_clock_ns(pid: int) -> int:
    """The CPU time of process `pid`, every thread's, in ns: clock_gettime of its process CPU
    clock (MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), what clock_getcpuclockid(3) gives; any
    process may read another's). -1 if it cannot be read (gone, not a process's leader)."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return -1


def _last_pid() -> int | None:
    """The pid the kernel handed out last in our pid namespace (processes and threads alike)."""
    try:
        with open(PROC_ROOT / "loadavg", "rb") as f:
            return int(f.read().split()[4])
    except (OSError, ValueError, IndexError):
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class ProcessCollector:
    """Facts cached per (pid, start time); CPU-time baselines per pid for usage() and walk()."""

    def __init__(self) -> None:
        self._info: dict[tuple[int, float], ProcessInfo] = {}
        self._procs: dict[int, psutil.Process] = {}
        self._seen: dict[int, _Seen] = {}  # pid -> its latest look: the CPU % baseline
        self._walked_info: dict[int, tuple[int, ProcessInfo]] = {}  # pid -> (start ticks, info)
        # pid -> /proc/PID/stat kept open: one pread a read instead of open, read and close.
        self._stat_files: dict[int, BinaryIO] = {}
        self._statm_files: dict[int, int] = {}  # pid -> fd of /proc/PID/statm, for walk's `exact`
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._max_files = min(MAX_STAT_FILES, max(0, soft // 4))  # the rest is the program's
        self._clocks = _cpu_clock_ns(os.getppid() or os.getpid()) > 0  # another process's CPU clock readable
        # /proc is our pid namespace's (not a host's bind-mounted into a container): the pids
        # handed out in ours (loadavg's last pid) are the new ones it lists.
        try:
            self._own_proc = self._clocks and os.readlink(PROC_ROOT / "self") == str(os.getpid())
        except OSError:
            self._own_proc = False
        self._last_pid: int | None = None  # as of the latest walk
        self._unlisted = 0  # walks since /proc was last listed
        self.stat_reads = 0  # /proc/PID/stat files read in full by walk(): what it costs
        self.listings = 0  # walks that listed /proc

    def _process(self, pid: int) -> psutil.Process | None:
        """The cached Process for pid, replaced if the pid now names another process."""
        p = self._procs.get(pid)
        if p is not None:
            if p.is_running():
                return p
            self._drop(pid)
        try:
            p = psutil.Process(pid)
        except _GONE:
            return None
        self._procs[pid] = p
        return p

    def _drop(self, pid: int) -> None:
        p = self._procs.pop(pid, None)
        self._seen.pop(pid, None)
        self._close_stat(pid)
        fd = self._statm_files.pop(pid, None)
        if fd is not None:
            os.close(fd)
        if p is not None:
            self._info = {k: v for k, v in self._info.items() if k[0] != pid}

    def info(self, pid: int) -> ProcessInfo | None:
        """Facts about pid, or None if it is gone, a zombie, or not in our pid namespace."""
        p = self._process(pid)
        if p is None:
            return None
        try:
            with p.oneshot():
                if p.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped
                    return None
                key = (pid, p.create_time())
                cached = self._info.get(key)
                if cached is not None:
                    return cached
                uid = p.uids().real
                user = p.username()
                cmdline = shlex.join(p.cmdline()) or None
        except _GONE:
            return None
        env = self._environ(p)
        try:
            cgroup = (PROC_ROOT / str(pid) / "cgroup").read_text()
        except OSError:
            cgroup = None
        info = ProcessInfo(
            pid=pid,
            start_ms=int(key[1] * 1000),
            uid=uid,
            user=user,
            cmdline=cmdline,
            container_id=container_id_from_cgroup(cgroup) if cgroup else None,
            slurm_job_id=env.get("SLURM_JOB_ID"),
            rank=_int(env.get("RANK")),
            local_rank=_int(env.get("LOCAL_RANK")),
            world_size=_int(env.get("WORLD_SIZE")),
            cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
        )
        self._info[key] = info
        return info

    @staticmethod
    def _environ(p: psutil.Process) -> dict[str, str]:
        # Readable for our own processes (or as root); other users' tags stay unknown.
        try:
            return p.environ()
        except (*_GONE, OSError):
            return {}

    def walk(self, exact: Collection[int] = ()) -> dict[int, Usage]:
        """usage() of every process of the host (of our pid namespace), for its top consumers.

        Most of a host sleeps, and this loop is most of what the daemon costs a process tick,
        so each process costs one system call when it has not run since the previous look. That
        call reads its process CPU clock (every thread's CPU time;
        no text for the kernel to write nor for us to parse, no file to keep open): the same
        value means it has not run, so its CPU time and RSS are as they were (a process must
        run to use CPU, start a thread, exec or exit; a reused pid is a new process with its
        own clock). Any other value, and /proc/PID/stat is read in full, through a handle kept
        open for a process that runs now and then, up to a share of our file limit (else the
        file is opened and closed again: a host may run thousands). `exact`: pids whose RSS is
        read even while they sleep (the GPU processes, whose RSS is stored: the kernel may
        reclaim a sleeper's pages), from /proc/PID/statm. Which processes there are: _pids().
        """
        now = time.monotonic()
        out: dict[int, Usage] = {}
        old, seen, files = self._seen, {}, self._stat_files
        clocks, clock_ns = self._clocks, time.clock_gettime_ns
        pids, listed = self._pids(old)
        for pid in pids:
            s, cpu_ns = old.get(pid), -1
            if clocks:
                try:
                    cpu_ns = clock_ns(((~pid) << 3) | 2)  # _cpu_clock_ns, inline: 500 a walk
                except OSError:  # gone: a listed one's read below says so
                    if not listed:
                        continue  # (unlisted, its pid may name a thread now)
                if s is not None and cpu_ns == s.cpu_ns >= 0:  # not run since
                    if pid in exact:  # its RSS is stored: /proc/PID/statm, a smaller read, has it
                        rss = self._statm_rss(pid)
                        if rss is None:
                            continue  # gone
                        if rss != s.idle.rss_bytes:
                            s.idle = Usage(rss, 0.0)
                    s.at = now
                    seen[pid] = s
                    out[pid] = s.idle
                    continue
            # A handle is kept for a process read in full again (it ran since): one that runs now
            # and then; a sleeper's would only hold kernel memory and a share of our file limit.
            keep = pid in files or (s is not None and len(files) < self._max_files)
            text = self._stat_text(pid) if keep else _read(pid)
            if text is None:
                continue
            self.stat_reads += 1
            usage = self._look(pid, s, text, now, seen, cpu_ns)
            if usage is not None:
                out[pid] = usage
        self._seen = seen  # the pids that left are forgotten
        for pid in files.keys() - seen.keys():
            self._close_stat(pid)
        for pid in self._statm_files.keys() - seen.keys():
            os.close(self._statm_files.pop(pid))
        self._walked_info = {pid: v for pid, v in self._walked_info.items() if pid in seen}
        return out

    def _pids(self, old: dict[int, _Seen]) -> tuple[list[int], bool]:
        """The pids a walk looks at, and whether they are /proc's listing. Listing /proc is
        most of a quiet walk's cost, and pids are handed out in turn: when few were since the
        previous walk, the processes are the known ones (a gone one's clock cannot be read)
        and those of the new pids that are processes (a pid is handed out for each thread too,
        whose pid names no process clock). Else, and every LIST_EVERY walks, the listing."""
        last = _last_pid() if self._own_proc else None  # before the listing: a later one is next walk's
        prev, self._last_pid = self._last_pid, last
        if (
            prev is None
            or last is None
            or not 0 <= last - prev <= max(NEW_PIDS_PROBED, len(old))  # many, or they wrapped round
            or self._unlisted >= LIST_EVERY
        ):
            self._unlisted = 0
            self.listings += 1
            return [int(name) for name in os.listdir(PROC_ROOT) if name.isdigit()], True
        self._unlisted += 1
        new = [pid for pid in range(prev + 1, last + 1) if pid not in old and _cpu_clock_ns(pid) >= 0]
        return [*old, *new], False

    def _look(
        self, pid: int, s: _Seen | None, text: bytes, now: float, seen: dict[int, _Seen], cpu_ns: int = -1
    ) -> Usage | None:
        """Usage from a stat text just read, and the process's new baseline in `seen`
        (`cpu_ns`: its CPU clock, read just before the text)."""
        stat = _parse_stat(text)
        if stat is None:  # a zombie
            return None
        start_ticks, cpu_ticks, rss_pages = stat
        rss = rss_pages * _PAGE
        cpu = _cpu_pct(s, start_ticks, cpu_ticks, now)
        if s is None or s.start_ticks != start_ticks:
            s = _Seen(start_ticks, cpu_ticks, now, Usage(rss, 0.0), cpu_ns)
        else:
            s.cpu_ticks, s.at, s.cpu_ns = cpu_ticks, now, cpu_ns
            if s.idle.rss_bytes != rss:
                s.idle = Usage(rss, 0.0)
        seen[pid] = s
        return Usage(rss, cpu)

    def walked_info(self, pid: int) -> ProcessInfo | None:
        """info(pid) for a pid of the latest walk(): read once for each process (the walk's
        start time says it is still the same one) instead of through psutil at every walk."""
        s, known = self._seen.get(pid), self._walked_info.get(pid)
        if s is not None and known is not None and known[0] == s.start_ticks:
            return known[1]
        info = self.info(pid)
        if info is not None and s is not None:
            self._walked_info[pid] = (s.start_ticks, info)
        return info

    def usage(self, pids: Iterable[int]) -> dict[int, Usage]:
        """{pid: Usage} for the pids still alive; cpu_pct is None on first sight.

        One read of /proc/PID/stat per pid gives RSS, CPU time and the start time (psutil
        would read several files per pid; this runs for every GPU process, periodically).
        cpu_pct is the whole-percent share of one core since the previous look at that pid.
        """
        out: dict[int, Usage] = {}
        now = time.monotonic()
        for pid in pids:
            text = self._stat_text(pid)
            usage = None if text is None else self._look(pid, self._seen.get(pid), text, now, self._seen)
            if usage is None:
                self._seen.pop(pid, None)
                continue
            out[pid] = usage
        return out

    def forget_gone(self) -> list[int]:
        """Drop cached processes that exited (or whose pid was reused); returns their pids."""
        gone = [pid for pid, p in self._procs.items() if not p.is_running()]
        # (walk() forgets the processes that left; usage()'s pids have files: the gone ones'
        # CPU clocks cannot be read, a cheaper test than a read of their stat)
        gone += [
            pid
            for pid in self._stat_files.keys() - self._procs.keys()
            if (_cpu_clock_ns(pid) < 0 if self._clocks else self._stat_text(pid) is None)
        ]
        for pid in gone:
            self._drop(pid)
        return gone

    def close(self) -> None:
        for pid in list(self._stat_files):
            self._close_stat(pid)
        for fd in self._statm_files.values():
            os.close(fd)
        self._statm_files.clear()

    def _statm_rss(self, pid: int) -> int | None:
        """pid's RSS from /proc/PID/statm (kept open), bytes; None if it is gone."""
        fd = self._statm_files.get(pid)
        for _ in range(2):  # a handle of a process that left fails: one fresh open
            if fd is None:
                try:
                    fd = self._statm_files[pid] = os.open(
                        f"{PROC_ROOT}/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC
                    )
                except OSError:
                    return None
            try:
                return int(os.pread(fd, 128, 0).split()[1]) * _PAGE
            except (OSError, IndexError, ValueError):
                os.close(self._statm_files.pop(pid))
                fd = None
        return None

    def _stat_text(self, pid: int) -> bytes | None:
        """/proc/PID/stat's text; None if the pid is gone or not in our namespace.

        The file stays open while the process lives. An open handle outlives its process:
        reads fail then (ESRCH), even once the pid is reused, so a failed read reopens.
        """
        f = self._stat_files.get(pid)
        if f is not None:
            try:
                return os.pread(f.fileno(), 4096, 0)
            except OSError:
                self._close_stat(pid)
        return self._open_stat(pid)

    def _open_stat(self, pid: int) -> bytes | None:
        """Open /proc/PID/stat, keep it open and return its text; None if gone."""
        try:
            f = open(f"{PROC_ROOT}/{pid}/stat", "rb", buffering=0)
        except OSError:
            return None
        try:
            text = os.pread(f.fileno(), 4096, 0)
        except OSError:
            f.close()
            return None
        self._stat_files[pid] = f
        return text

    def _close_stat(self, pid: int) -> None:
        f = self._stat_files.pop(pid, None)
        if f is not None:
            f.close()


def _read(pid: int) -> bytes | None:
    """/proc/PID/stat's text, the file opened and closed again; None if gone."""
    try:
        fd = os.open(f"{PROC_ROOT}/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)

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
from typing import BinaryIO

import psutil

PROC_ROOT = Path("/proc")
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)
# docker-<id>.scope, /docker/<id>, cri-containerd-<id>.scope, libpod-<id>.scope, crio-<id>,
# kubepods/.../<id>: all a 64-hex container id in the cgroup path.
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")
_UNIT = re.compile(r"\.(?:scope|service|slice)$")
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
MAX_STAT_FILES = 4096  # /proc/PID/stat files walk() keeps open, at most (a quarter of the limit)


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


def _cpu_pct(
    mark: tuple[int, int, float, int] | None, start_ticks: int, cpu_ticks: int, now: float
) -> float | None:
    """Whole % of one core since `mark` (start ticks, CPU ticks, monotonic s); None without
    one, or when the pid now names another process (its start time differs)."""
    if mark is None or mark[0] != start_ticks or now <= mark[2]:
        return None
    return float(round(100.0 * (cpu_ticks - mark[1]) / _CLK_TCK / (now - mark[2])))


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class ProcessCollector:
    """Facts cached per (pid, start time); CPU-time baselines per pid for usage()."""

    def __init__(self):
        self._info: dict[tuple[int, float], ProcessInfo] = {}
        self._procs: dict[int, psutil.Process] = {}
        # pid -> (start time, CPU time, both in clock ticks; monotonic s; RSS bytes): the CPU %
        # baseline. A different start time means the pid was reused: no baseline then.
        self._cpu_marks: dict[int, tuple[int, int, float, int]] = {}
        self._stat_texts: dict[int, bytes] = {}  # pid -> its stat text at the latest walk()
        self._walked_info: dict[int, tuple[int, ProcessInfo]] = {}  # pid -> (start ticks, info)
        # pid -> /proc/PID/stat kept open: one pread a read instead of open, read and close.
        self._stat_files: dict[int, BinaryIO] = {}
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self._max_files = min(MAX_STAT_FILES, max(0, soft // 4))  # the rest is the program's

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
        self._cpu_marks.pop(pid, None)
        self._close_stat(pid)
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

    def walk(self) -> dict[int, tuple[int, float | None]]:
        """usage() of every process of the host (of our pid namespace), for its top consumers.

        One listing of /proc and one read of each /proc/PID/stat, through a handle kept open
        (one pread instead of open, read and close) up to a share of our file limit; past it
        the files are opened and closed again (a host may run thousands). A stat text byte for
        byte what it was at the previous walk (asleep all along: most of a host) means no CPU
        used and the same RSS: it is not parsed again. This loop is most of what the daemon
        costs a process tick.
        """
        now = time.monotonic()
        out: dict[int, tuple[int, float | None]] = {}
        old_marks, marks = self._cpu_marks, {}
        old_texts, texts = self._stat_texts, {}
        files, pread = self._stat_files, os.pread
        for name in os.listdir(PROC_ROOT):
            if not name.isdigit():
                continue
            pid = int(name)
            f, text = files.get(pid), None
            if f is not None:
                try:
                    text = pread(f.fileno(), 4096, 0)
                except OSError:  # gone; a reused pid needs a fresh handle (below)
                    pass
            if text is not None:
                texts[pid] = text
                mark = old_marks.get(pid)
                if mark is not None and text == old_texts.get(pid):
                    marks[pid] = (mark[0], mark[1], now, mark[3])
                    out[pid] = (mark[3], 0.0)
                    continue
                stat = _parse_stat(text)
            else:
                stat = self._stat(pid) if len(files) < self._max_files else _read_stat(pid)
            if stat is None:
                continue
            start_ticks, cpu_ticks, rss_pages = stat
            marks[pid] = (start_ticks, cpu_ticks, now, rss_pages * _PAGE)
            out[pid] = (rss_pages * _PAGE, _cpu_pct(old_marks.get(pid), start_ticks, cpu_ticks, now))
        self._cpu_marks, self._stat_texts = marks, texts  # the pids that left are forgotten
        for pid in files.keys() - out.keys():
            self._close_stat(pid)
        self._walked_info = {pid: v for pid, v in self._walked_info.items() if pid in out}
        return out

    def walked_info(self, pid: int) -> ProcessInfo | None:
        """info(pid) for a pid of the latest walk(): read once for each process (the walk's
        start time says it is still the same one) instead of through psutil at every walk."""
        mark, known = self._cpu_marks.get(pid), self._walked_info.get(pid)
        if mark is not None and known is not None and known[0] == mark[0]:
            return known[1]
        info = self.info(pid)
        if info is not None and mark is not None:
            self._walked_info[pid] = (mark[0], info)
        return info

    def usage(self, pids) -> dict[int, tuple[int, float | None]]:
        """{pid: (rss_bytes, cpu_pct)} for the pids still alive; cpu_pct is None on first sight.

        One read of /proc/PID/stat per pid gives RSS, CPU time and the start time (psutil
        would read several files per pid; this runs for every GPU process, periodically).
        cpu_pct is the whole-percent share of one core since the previous call for that pid.
        """
        out: dict[int, tuple[int, float | None]] = {}
        now = time.monotonic()
        for pid in pids:
            stat = self._stat(pid)
            if stat is None:
                self._cpu_marks.pop(pid, None)
                continue
            start_ticks, cpu_ticks, rss_pages = stat
            cpu = _cpu_pct(self._cpu_marks.get(pid), start_ticks, cpu_ticks, now)
            self._cpu_marks[pid] = (start_ticks, cpu_ticks, now, rss_pages * _PAGE)
            out[pid] = (rss_pages * _PAGE, cpu)
        return out

    def forget_gone(self) -> list[int]:
        """Drop cached processes that exited (or whose pid was reused); returns their pids."""
        gone = [pid for pid, p in self._procs.items() if not p.is_running()]
        # (walk() forgets the CPU marks of every process that left; usage()'s pids have files)
        gone += [pid for pid in self._stat_files.keys() - self._procs.keys() if self._stat(pid) is None]
        for pid in gone:
            self._drop(pid)
        return gone

    def close(self) -> None:
        for pid in list(self._stat_files):
            self._close_stat(pid)

    def _stat(self, pid: int) -> tuple[int, int, int] | None:
        """/proc/PID/stat parsed; None if the pid is gone, a zombie or not in our namespace.

        The file stays open while the process lives. An open handle outlives its process:
        reads fail then (ESRCH), even once the pid is reused, so a failed read reopens.
        """
        f = self._stat_files.get(pid)
        if f is not None:
            try:
                stat = _parse_stat(os.pread(f.fileno(), 4096, 0))
                if stat is not None:
                    return stat
            except OSError:
                pass
            self._close_stat(pid)
        try:
            f = open(f"{PROC_ROOT}/{pid}/stat", "rb", buffering=0)
        except OSError:
            return None
        try:
            stat = _parse_stat(os.pread(f.fileno(), 4096, 0))
        except OSError:
            stat = None
        if stat is None:
            f.close()
        else:
            self._stat_files[pid] = f
        return stat

    def _close_stat(self, pid: int) -> None:
        f = self._stat_files.pop(pid, None)
        if f is not None:
            f.close()


def _read_stat(pid: int) -> tuple[int, int, int] | None:
    """/proc/PID/stat parsed, the file opened and closed again; None if gone or a zombie."""
    try:
        fd = os.open(f"{PROC_ROOT}/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        return _parse_stat(os.read(fd, 4096))
    except OSError:
        return None
    finally:
        os.close(fd)

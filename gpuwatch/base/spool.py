"""Spool files: events a client could not deliver, kept on disk until someone replays them.

Shared by the client (writes and replays its own), the daemon (adopts the files of processes
that died) and the readers (say how many events wait). One file per client process,
<pid>-<token>.jsonl, one event per line.

Where (gpuwatch.base.paths.spool_dir): a user-mode daemon's clients spool under the user's data
directory (mode 0700); a system daemon's under /var/lib/gpuwatch/spool, which the daemon makes
mode 1777 like /tmp: anyone may add a file, only its owner or the daemon may remove or rename
it. Files there are 0644 so the daemon (its own uid) can read them; they hold what the
world-readable database will hold anyway. Whose events they are is the file's owner uid.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuwatch.base import paths

SUFFIX = ".jsonl"
SYSTEM_DIR_MODE = 0o1777
SYSTEM_FILE_MODE = 0o644
USER_FILE_MODE = 0o600


def file_mode(directory: Path) -> int:
    """0644 in a shared (sticky) spool directory, whose daemon runs as another uid; else 0600."""
    try:
        shared = os.stat(directory).st_mode & stat.S_ISVTX
    except OSError:
        shared = False
    return SYSTEM_FILE_MODE if shared else USER_FILE_MODE


def writer_pid(name: str) -> int | None:
    """The pid in a spool file's name, None when it is not a spool file's name."""
    pid = name.split("-", 1)[0]
    return int(pid) if name.endswith(SUFFIX) and "-" in name and pid.isdigit() else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def writer_gone(pid: int, mtime_s: float) -> bool:
    """True when the process that wrote a file last modified at `mtime_s` has exited: the pid
    is gone, or now names a process started after that write (the pid was reused)."""
    import psutil  # here: the readers (the TUI) need none of it

    if not pid_alive(pid):
        return True
    try:
        started: float = psutil.Process(pid).create_time()
        return started > mtime_s + 1.0
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def reader_dirs(configured: Path | None = None) -> list[Path]:
    """Where a reader looks for waiting events: the configured spool, this user's, the system's."""
    return list(dict.fromkeys([d for d in (configured, paths.spool_dir(False), paths.spool_dir(True)) if d]))


def waiting(dirs: list[Path]) -> tuple[int, int, list[Path]]:
    """(files, events, the directories holding them) waiting in the spools this user can list."""
    files = events = 0
    where: list[Path] = []
    for directory in dict.fromkeys(dirs):
        try:
            names = [n for n in os.listdir(directory) if writer_pid(n) is not None]
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    events += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 16), b""))
                files += 1
            except OSError:
                continue
            if directory not in where:
                where.append(directory)
    return files, events, where


def waiting_line(dirs: list[Path]) -> str | None:
    """A sentence for readers when events wait in a spool, else None."""
    files, events, where = waiting(dirs)
    if not files:
        return None
    return (
        f"{events} event{'' if events == 1 else 's'} in {files} spool file{'' if files == 1 else 's'} "
        f"({', '.join(map(str, where))}) wait for the daemon: stored once it runs"
    )

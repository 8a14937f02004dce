"""Whether the daemon can write its database, told to readers that cannot ask the database.

While the writer cannot write (disk full, read-only filesystem, the file gone), the daemon keeps
a small JSON report in its runtime directory, next to its socket: a tmpfs that still has room
when the database's filesystem has none. `gpuwatch status`, `gpuwatch doctor` and the TUI read
it; it is removed when writing works again or the daemon stops, and ignored if the process that
wrote it is gone.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from gpuwatch.base import paths

FILE_NAME = "store-health.json"


@dataclass
class StoreHealth:
    """Why the database is not being written, since when, and what was lost meanwhile."""

    path: str
    problem: str  # "disk full", "read-only", "deleted", ...
    error: str  # SQLite's own words
    since_ms: int
    free_bytes: int | None
    failed_jobs: int = 0  # writes answered ok=False since `since_ms`
    pid: int = 0  # the writing process, so a reader can tell a stale report

    def line(self) -> str:
        free = "unknown" if self.free_bytes is None else f"{self.free_bytes:,}"
        return (
            f"the daemon cannot write {self.path}: {self.problem} ({self.error}); {free} bytes "
            f"free; {self.failed_jobs} writes failed so far (samples dropped, workloads' events "
            "kept spooled)"
        )


def report_path(socket_path: str | os.PathLike[str]) -> Path:
    return Path(socket_path).parent / FILE_NAME


def publish(socket_path: str | os.PathLike[str], health: StoreHealth | None) -> None:
    """Write the report (atomically, world-readable like the socket's directory) or remove it."""
    target = report_path(socket_path)
    if health is None:
        target.unlink(missing_ok=True)
        return
    tmp = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(asdict(health)))
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as e:  # e.g. the socket's directory is on the full disk too
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(target)) from None


def read(
    db_path: str | os.PathLike[str], socket_paths: Iterable[str | os.PathLike[str]] = ()
) -> StoreHealth | None:
    """The live report about `db_path`, looked for beside each of `socket_paths` and both
    default sockets; None when the daemon writing it reports nothing wrong."""
    want = os.path.realpath(db_path)
    candidates = [*socket_paths, paths.default_socket_path(True), paths.default_socket_path(False)]
    for sock in dict.fromkeys(map(str, candidates)):
        try:
            health = StoreHealth(**json.loads(report_path(sock).read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if os.path.realpath(health.path) == want and _alive(health.pid):
            return health
    return None


def _alive(pid: int) -> bool:
    return pid > 0 and os.path.exists(f"/proc/{pid}")

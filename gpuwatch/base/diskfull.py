"""Writes that fail for lack of space: one warning when they start failing, one when they work again.

Each of our writers (the database, the health report, spool files, profiler traces, OOM memory
snapshots, end-state files) reports through a FullDisk of its own, so a full disk costs two log
lines per writer however often it writes, never a traceback, and each line names the path and
the bytes free there.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def no_space(e: BaseException) -> bool:
    """True for "No space left on device" and "Disk quota exceeded"."""
    return isinstance(e, OSError) and e.errno in NO_SPACE


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes free to this process on the filesystem holding `path` (its directory if it is gone)."""
    for where in (path, os.path.dirname(os.path.abspath(path))):
        try:
            return shutil.disk_usage(where).free
        except OSError:
            continue
    return None


def show_bytes(n: int | None) -> str:
    return "unknown" if n is None else f"{n:,}"


class FullDisk:
    """The state of one writer: `failed()` on each write that found no space, `ok()` on each
    that worked; the first of each run is logged, at `level`."""

    def __init__(self, logger: logging.Logger, what: str, level: int = logging.WARNING):
        self.log, self.what, self.level = logger, what, level
        self.since: float | None = None
        self.failures = 0

    def failed(self, path: str | os.PathLike[str], error: OSError, consequence: str = "") -> None:
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            self.log.log(
                self.level,
                "%s: cannot write %s: %s; %s bytes free there%s",
                self.what,
                path,
                error.strerror or error,
                show_bytes(free_bytes(path)),
                f"; {consequence}" if consequence else "",
            )

    def ok(self, path: str | os.PathLike[str]) -> None:
        if self.since is not None:
            self.log.log(
                self.level,
                "%s: writing %s again after %.0f s (%d writes failed meanwhile)",
                self.what,
                path,
                time.monotonic() - self.since,
                self.failures,
            )
            self.since, self.failures = None, 0

"""Spools of clients that died, adopted by the daemon and replayed as their file's owner.

A client that cannot reach the daemon appends its events to a spool file (gpuwatch/base/spool.py)
and replays them itself once the daemon is back. When it ended or died first, nobody would:
the daemon looks at start and every cfg.spool_scan_interval for spool files whose writer has
exited, replays their events with their own ids (idempotent: a replay racing the client's own
stores each event once) and deletes them. A run marked `lost` meanwhile gets its real end.

Whose events they are comes from the file, never from its name or content: it is opened with
O_NOFOLLOW and its owner uid read with fstat, then used as SO_PEERCRED's uid is on the socket,
so the usual rule holds: a uid writes only to runs it created. A user-mode daemon takes files
of its own uid only. A file refused (another uid's in a user spool, a link, not a regular file)
is logged once and left where it is.

A spool can hold millions of events (a long run while the daemon was down). Replaying it must
not starve the GPU readers, which are Python threads of this process: the events are decoded,
validated and written by a process of its own at a lower CPU priority (daemon/replay.py), a
batch per short transaction; this process only checks the file and waits. The scans run in a
low-priority thread of their own (gpuwatch/monitor/periodic.py).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import IO

from gpuwatch.base import priority, spool
from gpuwatch.base.config import Config
from gpuwatch.base.unix_socket import user_name
from gpuwatch.monitor.periodic import Periodic
from gpuwatch.store import Writer

log = logging.getLogger(__name__)

STOP_WAIT_S = 60.0  # a replay under way is told to stop; its scan thread ends within this


class SpoolAdopter:
    def __init__(self, cfg: Config, writer: Writer):
        self.dir: Path = cfg.spool_path
        self.interval = cfg.spool_scan_interval
        self.system = cfg.system
        self.writer = writer
        self._refused: set[tuple[int, int]] = set()  # (st_dev, st_ino) already logged
        self._periodic = Periodic("spool adoption", self.interval, self.scan, priority.lower_thread)
        self._proc: subprocess.Popen[str] | None = None  # a replay under way

    def prepare(self) -> None:
        """System mode: the shared spool directory, which every user may add files to."""
        if not self.system:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            os.chmod(self.dir, spool.SYSTEM_DIR_MODE)
        except OSError as e:
            log.warning(
                "spool directory %s unusable (%s): clients keep their events in their own "
                "data directory and replay them themselves",
                self.dir,
                e.strerror or e,
            )

    def start(self) -> None:
        """Adopt now, then every interval, in a low-priority thread of its own (a scan that
        fails, one bad file or a full disk, is logged and the next one goes ahead)."""
        self.prepare()
        self._periodic.start()

    def stop(self) -> None:
        self._periodic.stop(0)
        proc = self._proc
        if proc is not None:  # what it stored is committed; the file stays for the next start
            proc.terminate()
        self._periodic.stop(STOP_WAIT_S)

    def scan(self) -> int:
        """Replay every spool file whose writer has exited; returns the events stored."""
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            return 0
        stored = 0
        for name in names:
            pid = spool.writer_pid(name)
            if pid is not None:
                stored += self._adopt(self.dir / name, pid)
        return stored

    def _adopt(self, path: Path, pid: int) -> int:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0  # replayed by its client meanwhile
        except OSError as e:
            st = os.lstat(path) if os.path.lexists(path) else None
            self._refuse(path, st, f"cannot open it ({e.strerror or e})")
            return 0
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            why = self._not_acceptable(st)
            if why:
                self._refuse(path, st, why)
                return 0
            if not spool.writer_gone(pid, st.st_mtime):
                return 0  # its client is alive and replays it itself
            return self._replay(path, st.st_uid, pid, f)

    def _not_acceptable(self, st: os.stat_result) -> str:
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_nlink != 1:
            return "it has other hard links"
        if not self.system and st.st_uid != os.getuid():
            return f"owned by uid {st.st_uid}, not by this daemon's user ({os.getuid()})"
        return ""

    def _refuse(self, path: Path, st: os.stat_result | None, why: str) -> None:
        key = (st.st_dev, st.st_ino) if st is not None else (0, hash(str(path)))
        if key not in self._refused:
            self._refused.add(key)
            log.warning("spool file %s refused: %s", path, why)

    def _replay(self, path: Path, uid: int, pid: int, f: IO[bytes]) -> int:
        """Store the file's events through a process of its own (daemon/replay.py), handing it
        the file already opened and checked here; delete the file once all are stored."""
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpuwatch.daemon.replay",
                    str(f.fileno()),
                    str(self.writer.path),
                    str(uid),
                    user_name(uid),
                    str(pid),
                ],
                pass_fds=(f.fileno(),),
                stdout=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        except OSError as e:
            log.warning(
                "spool file %s: cannot start its replay (%s); tried again later", path, e.strerror or e
            )
            return 0
        self._proc = proc
        out, _ = proc.communicate()
        self._proc = None
        try:
            result = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            log.warning(
                "spool file %s: its replay ended with status %s; tried again later", path, proc.returncode
            )
            return 0
        stored: int = result.get("stored", 0)
        if not result.get("complete"):
            log.warning(
                "spool file %s: stored %d events, then %s; the rest is tried again later",
                path,
                stored,
                result.get("error", "stopped"),
            )
            return stored  # the database cannot take them now: the file stays for the next scan
        try:
            path.unlink()
        except OSError as e:
            log.warning("spool file %s replayed but not removed (%s)", path, e.strerror or e)
        unreadable = result.get("unreadable", 0)
        log.info(
            "spool file %s of uid %d (pid %d, exited): %d events stored%s",
            path,
            uid,
            pid,
            stored,
            f", {unreadable} unreadable lines skipped" if unreadable else "",
        )
        if result.get("refused"):
            log.warning(
                "spool file %s of uid %d: %d events refused, first: %s",
                path,
                uid,
                result["refused"],
                result.get("first_refused"),
            )
        return stored

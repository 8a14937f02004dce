"""The optional line on a user's own logged-in terminals (like `write`), for a deliverer that
runs as that user (a user daemon, a `gpuwatch run` wrapper); off unless notify_terminals."""

from __future__ import annotations

import os
import pwd
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # no escape sequences from a run's name


def user_terminals(uid: int) -> list[str]:
    """/dev paths of the terminals `uid` is logged in on and owns."""
    import psutil

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return []
    found = []
    for session in psutil.users():
        path = f"/dev/{session.terminal}" if session.terminal else ""
        try:
            if session.name == name and path and os.stat(path).st_uid == uid and path not in found:
                found.append(path)
        except OSError:
            continue
    return found


def write_line(title: str, uid: int, terminals: list[str] | None = None) -> int:
    """Write '[gpuwatch] TITLE' on each of the user's terminals; how many took it."""
    line = f"\r\n[gpuwatch] {_CONTROL.sub(' ', title)[:300]}\r\n".encode()
    written = 0
    for path in user_terminals(uid) if terminals is None else terminals:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except OSError:
            continue  # mesg n, or the session just ended
        try:
            os.write(fd, line)
            written += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return written

"""The kernel OOM killer's victims, from the kernel log (/dev/kmsg, what `dmesg` reads).

Readable by root (the daemon) and, where kernel.dmesg_restrict is 0, by anyone; unreadable
means "unknown", never "not killed". Only what is still in the kernel's ring buffer is seen.
"""

from __future__ import annotations

import errno
import os
import re

KMSG = "/dev/kmsg"
READ_BYTES = 8192  # /dev/kmsg hands out one record per read; a record is at most ~1 KiB
# "Out of memory: Killed process 4242 (python) total-vm:..." and the cgroup variant
# "Memory cgroup out of memory: Killed process 4242 (python) ...".
_KILLED = re.compile(r"[Oo]ut of memory.*?: Killed process (\d+) \(")


def oom_killed(pids: set[int], path: str = KMSG) -> dict[int, str]:
    """{pid: the kernel's message} for each of `pids` the OOM killer killed; {} if unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return {}
    found: dict[int, str] = {}
    try:
        while True:
            try:
                chunk = os.read(fd, READ_BYTES)
            except BlockingIOError:  # read everything the buffer holds
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten while we read: go on
                    continue
                break
            if not chunk:
                break
            for line in chunk.decode(errors="replace").splitlines():
                message = line.split(";", 1)[1] if ";" in line else line
                match = _KILLED.search(message)
                if match and int(match.group(1)) in pids:
                    found[int(match.group(1))] = message.strip()
    finally:
        os.close(fd)
    return found

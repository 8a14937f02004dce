"""sd_notify by hand: one datagram per message to the AF_UNIX socket named in $NOTIFY_SOCKET.

No libsystemd needed. Names starting with '@' are abstract sockets (leading NUL byte). With
NOTIFY_SOCKET unset (not run by systemd as Type=notify) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        name = env.get("NOTIFY_SOCKET", "")
        self.address: str | bytes | None = None
        if name.startswith("@"):
            self.address = b"\0" + name[1:].encode()
        elif name.startswith("/"):
            self.address = name
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID, when set, says which process the watchdog is meant for.
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval_s = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else 0.0
        self._sock: socket.socket | None = None
        if self.address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *fields: str) -> bool:
        """Send 'KEY=value' fields in one datagram; True if it went out."""
        if self._sock is None or self.address is None:  # the socket exists only with an address
            return False
        message = "\n".join(f.replace("\n", " ") for f in fields).encode()
        try:
            self._sock.sendto(message, self.address)
            return True
        except OSError as e:  # systemd gone or socket wrong: never fatal for the daemon
            log.warning("sd_notify to %s failed: %s", os.environ.get("NOTIFY_SOCKET"), e)
            return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

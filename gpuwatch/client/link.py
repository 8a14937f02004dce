"""One greeted connection to the daemon, and one request over it.

The transport keeps a link open for a run's events; a command or the TUI opens one to ask a
single thing (a profile, a stack dump, a note, a wish). This module imports no sampler and no
torch, so the TUI may ask through it.
"""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path
from typing import Any

from gpuwatch import protocol
from gpuwatch.base import paths
from gpuwatch.base.config import Config
from gpuwatch.base.version import __version__

HELLO = {"type": "hello", "client": f"gpuwatch/{__version__}"}
NO_DAEMON = (
    "on-demand {what} needs the gpuwatch daemon, and none answers on {sockets} "
    "(start one with `gpuwatch daemon`)"
)


class TransportClosed(RuntimeError):
    pass


class RequestError(Exception):
    """A request that could not be made or was refused; the message is one line."""


class NoDaemon(RequestError):
    """No daemon answers: the caller may do the thing itself where it can."""


def socket_candidates(cfg: Config) -> list[Path]:
    """The configured socket; with no explicit choice, also a system daemon's."""
    found = [cfg.socket_path]
    if not cfg.socket and not cfg.system:
        found.append(paths.default_socket_path(system=True))
    return found


class Link:
    """One greeted connection: frames out, reply frames in, pushed control frames aside."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    @classmethod
    def open(cls, path: Path, timeout: float) -> Link:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            link = cls(sock)
            link.sock.sendall(protocol.encode(HELLO))
            welcome = link.read_frame(timeout)
        except BaseException:
            sock.close()
            raise
        if welcome.get("type") != "welcome":
            sock.close()
            raise TransportClosed(f"{path}: {welcome.get('error', welcome)}")
        return link

    def read_frame(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransportClosed("no reply from the daemon in time")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise TransportClosed("the daemon closed the connection")
            self.buf += chunk
        end = self.buf.index(b"\n") + 1
        line = bytes(self.buf[:end])
        del self.buf[:end]
        return protocol.decode(line)

    def pending(self) -> bool:
        """True if a frame (or the end of the stream) can be read now without waiting."""
        return b"\n" in self.buf or bool(select.select([self.sock], [], [], 0)[0])

    def close(self) -> None:
        self.sock.close()


def daemon_request(cfg: Config, frame: dict[str, Any], what: str) -> dict[str, Any]:
    """Send one frame to the daemon on a connection of its own; its reply. `what` names the
    feature in the NoDaemon error ("profiling": "on-demand profiling needs the gpuwatch daemon")."""
    candidates = socket_candidates(cfg)
    for path in candidates:
        try:
            link = Link.open(path, timeout=5.0)
        except (OSError, TransportClosed, protocol.ProtocolError):
            continue
        try:
            link.sock.sendall(protocol.encode(frame))
            return link.read_frame(timeout=60.0)
        except (OSError, TransportClosed, protocol.ProtocolError) as e:
            raise RequestError(f"the daemon at {path} did not answer: {e}") from None
        finally:
            link.close()
    raise NoDaemon(NO_DAEMON.format(what=what, sockets=" or ".join(map(str, candidates))))

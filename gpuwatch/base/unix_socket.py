"""Unix stream sockets with identity from the kernel: who is at the other end (SO_PEERCRED),
and binding a socket with its mode set from the first instant. The daemon's ingest, the notify
service and the private ingest of `gpuwatch run` all listen this way."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
import tempfile
from pathlib import Path


class SocketError(OSError):
    """A socket cannot be listened on (taken or unusable); one line saying why."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def in_group(uid: int, gid: int, group: str) -> bool:
    """True if the user `uid` (primary group `gid`) is a member of `group`."""
    if not group:
        return False
    try:
        group_gid = grp.getgrnam(group).gr_gid
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return False
    return group_gid in os.getgrouplist(name, gid)


def bind_socket(path: Path, mode: int, group: str = "") -> socket.socket:
    """Listen at `path` with `mode` from the first instant: bind in a private directory, set
    mode and group there, then rename into place (no bind->chmod window, no umask games)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if mode & 0o077 else 0o700)
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            path.unlink(missing_ok=True)  # stale: nothing answers
        except OSError as e:
            raise SocketError(f"{path} exists and cannot be probed: {e.strerror}") from None
        else:
            raise SocketError(f"another daemon is already listening on {path}")
        finally:
            probe.close()
    private = tempfile.mkdtemp(prefix=".bind-", dir=path.parent)
    tmp = os.path.join(private, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(tmp)
        os.chmod(tmp, mode)
        if group:
            try:
                os.chown(tmp, -1, grp.getgrnam(group).gr_gid)
            except KeyError:
                raise SocketError(f"socket_group {group!r} does not exist") from None
        sock.listen(128)
        os.rename(tmp, path)
    except BaseException:
        sock.close()
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        os.rmdir(private)
    return sock

"""The notify service (`gpuwatch notify serve`): the one process of a system install that sends
alerts out. It reads the shared database read-only, keeps subscriptions and delivery state in
its own private store, and answers `gpuwatch notify ...` on a socket every user may connect to,
each request done as the uid SO_PEERCRED gives, never one a message claims."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from pathlib import Path

from gpuwatch.alerts import admin
from gpuwatch.alerts import subscriptions as subs
from gpuwatch.alerts.deliver import Deliverer, max_alert_id
from gpuwatch.alerts.service import MAX_REQUEST, Local, answer
from gpuwatch.base.config import Config
from gpuwatch.base.unix_socket import bind_socket, peer_credentials
from gpuwatch.store import subscriptions as stored_subs

log = logging.getLogger("gpuwatch.notify")


def admin_file(cfg: Config) -> Path:
    """systemd's LoadCredential copy when run by the unit, else the configured file."""
    from gpuwatch.base import paths

    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if creds and (Path(creds) / "notify.toml").exists():
        return Path(creds) / "notify.toml"
    return Path(cfg.notify_admin_file) if cfg.notify_admin_file else paths.SYSTEM_NOTIFY_ADMIN_FILE


class NotifyService:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.api = Local(cfg.notify_db_path, cfg.db_path)
        self.deliverer = Deliverer(cfg.notify_db_path, cfg.db_path, cfg.notify_group_seconds)
        try:
            entries = admin.load(admin_file(cfg))
        except subs.SubscriptionError as e:
            log.error("admin-wide subscriptions not loaded: %s", e)
        else:
            stored_subs.sync_admin(self.deliverer.conn, entries, max_alert_id(cfg.db_path))
            log.info("%d admin-wide subscription(s)", len(entries))
        self.sock = bind_socket(cfg.notify_socket_path, 0o666)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        accept = threading.Thread(target=self._accept, name="notify-accept", daemon=True)
        accept.start()
        self._threads.append(accept)
        self.deliverer.start()
        log.info(
            "delivering alerts from %s; subscriptions on %s", self.cfg.db_path, self.cfg.notify_socket_path
        )

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5.0)
                _, uid, _ = peer_credentials(conn)
                line = b""
                while b"\n" not in line and len(line) <= MAX_REQUEST:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    line += chunk
                if len(line) > MAX_REQUEST:
                    reply = {"error": f"request over {MAX_REQUEST} bytes"}
                else:
                    reply = answer(self.api, uid, line.split(b"\n", 1)[0])
                conn.settimeout(60.0)
                conn.sendall((json.dumps(reply) + "\n").encode())
            except OSError:
                pass  # the client went away; nothing of ours to keep
            except Exception:  # a bug answering one request must not stop the service
                log.exception("notify request failed")

    def stop(self) -> None:
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            os.unlink(self.cfg.notify_socket_path)
        except OSError:
            pass
        self.deliverer.stop()

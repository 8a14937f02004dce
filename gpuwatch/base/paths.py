"""Where gpuwatch keeps its database, socket and run files, in system and per-user mode."""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_STATE_DIR = Path("/var/lib/gpuwatch")
SYSTEM_RUNTIME_DIR = Path("/run/gpuwatch")
SYSTEM_CONFIG_FILE = Path("/etc/gpuwatch/gpuwatch.toml")
# Alert delivery (gpuwatch-notify.service): its private state, its socket, and the admins'
# subscriptions (root-only: their URLs are secrets, unlike gpuwatch.toml which users read).
SYSTEM_NOTIFY_STATE_DIR = Path("/var/lib/gpuwatch-notify")
SYSTEM_NOTIFY_SOCKET = Path("/run/gpuwatch-notify/notify.sock")
SYSTEM_NOTIFY_ADMIN_FILE = Path("/etc/gpuwatch/notify.toml")
NOTIFY_DB_NAME = "notify.db"
DB_NAME = "gpuwatch.db"
SOCKET_NAME = "gpuwatch.sock"


def user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "gpuwatch"


def user_runtime_dir() -> Path:
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "gpuwatch"
    # No logind session (plain SSH without pam_systemd, containers): a private dir under /tmp.
    return Path("/tmp") / f"gpuwatch-{os.getuid()}"


def user_config_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "gpuwatch" / "gpuwatch.toml"


def state_dir(system: bool) -> Path:
    return SYSTEM_STATE_DIR if system else user_data_dir()


def runtime_dir(system: bool) -> Path:
    return SYSTEM_RUNTIME_DIR if system else user_runtime_dir()


def default_db_path(system: bool) -> Path:
    return state_dir(system) / DB_NAME


def default_socket_path(system: bool) -> Path:
    return runtime_dir(system) / SOCKET_NAME


def spool_dir(system: bool) -> Path:
    """Where clients keep events the daemon could not take (see gpuwatch/base/spool.py)."""
    return state_dir(system) / "spool"


def system_daemon_present() -> bool:
    """True when a system-wide daemon's socket exists: readers and clients then use it."""
    return (SYSTEM_RUNTIME_DIR / SOCKET_NAME).exists()


def reader_db_path(configured: str = "") -> Path:
    """The database a reader opens: the configured one, else the system daemon's if one runs,
    else the user's own."""
    if configured:
        return Path(configured)
    return default_db_path(system=system_daemon_present())


def notify_db_path(system: bool) -> Path:
    """Subscriptions and their delivery state: the notify service's, or the user's own."""
    return (SYSTEM_NOTIFY_STATE_DIR if system else user_data_dir()) / NOTIFY_DB_NAME

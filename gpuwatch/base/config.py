"""One typed config.

Precedence, highest first: command-line flags > environment (GPUWATCH_<KEY>) > user file
($GPUWATCH_CONFIG, else $XDG_CONFIG_HOME/gpuwatch/gpuwatch.toml) > /etc/gpuwatch/gpuwatch.toml
> defaults. Unknown keys are refused with one line naming the key and where it came from.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    try:
        import tomli as tomllib
    except ImportError:  # a `gpuwatch run` child's own Python 3.10 env: files need tomli
        tomllib = None

from gpuwatch.base import paths

ENV_PREFIX = "GPUWATCH_"
# GPUWATCH_* variables that are not config keys: the config file's path, and the run id that
# `gpuwatch run` hands its child so an instrumented child joins the wrapper's run, and the
# switch for its zero-code hooks (read by the bootstrap).
# The bootstrap's note path says where a child that cannot be instrumented explains why; the
# git HEAD is the one the wrapper found (client/metadata.py).
NOT_CONFIG_ENV = {
    "GPUWATCH_CONFIG",
    "GPUWATCH_RUN_ID",
    "GPUWATCH_INSTRUMENT",
    "GPUWATCH_BOOTSTRAP_NOTE",
    "GPUWATCH_RUN_NAME",
    "GPUWATCH_GIT_HEAD",
}


class ConfigError(ValueError):
    """A config value or key is wrong; the message is one line naming what and where."""


@dataclass(frozen=True)
class Config:
    # Where things live. Empty means "the default for the mode" (see gpuwatch.base.paths).
    db: str = ""
    socket: str = ""
    runs_dir: str = ""
    spool_dir: str = ""  # events clients could not deliver (gpuwatch/base/spool.py)
    system: bool = False  # system mode: /var/lib/gpuwatch and /run/gpuwatch

    # Sampling intervals, seconds.
    interval: float = 1.0  # GPUs and GPU processes
    host_interval: float = 1.0
    process_interval: float = 5.0  # GPU-process rows (and their RSS/CPU) are written this often
    top_processes: int = 5  # the host's top CPU consumers kept each process_interval (0 = none)

    # Retention and size.
    raw_retention_hours: float = 24.0
    minute_retention_days: float = 14.0
    hour_retention_days: float = 365.0
    max_db_mb: float = 2048.0

    # Daemon.
    metrics_listen: str = ""  # e.g. "127.0.0.1:9400"; empty = off
    metrics_hostname: str = ""  # the Hostname label on /metrics; empty = this machine's name
    admin_group: str = "gpuwatch-admin"  # members may control every run
    socket_group: str = ""  # if set, only this group may connect; else everyone may
    # events per second per uid: a guard against abuse. A client folds its steps past 1,000 a
    # second (client/fold.py), so 50 busy processes of one user stay under it.
    rate_limit_events: int = 50_000
    stall_factor: float = 10.0  # a run is stalled after max(factor x median step, floor)
    stall_floor: float = 120.0
    spool_scan_interval: float = 30.0  # seconds between looks for spools of clients that died

    # Alert rules (gpuwatch/alerts/rules.py; docs/alert-kinds.md). Durations are minutes or
    # seconds as named, floats (GPUWATCH_IDLE_GPU_MINUTES=0.25 works).
    idle_gpu_min_mib: float = 1024.0  # gpu.idle_held: a process holds at least this much
    idle_gpu_util_pct: float = 2.0  # on a GPU whose utilisation stays at or below this
    idle_gpu_minutes: float = 30.0  # for this long
    slow_alert_pct: float = 50.0  # run.slow: tokens/s below this % of the run's own median
    slow_alert_minutes: float = 10.0  # for this long
    throttle_alert_minutes: float = 10.0  # gpu.throttled: thermal or power throttling this long
    hung_alert_seconds: float = 5.0  # gpu.not_responding: NVML calls on a GPU late this long
    disk_low_pct: float = 5.0  # disk.low: the database's filesystem has less free than this %

    # Readers: the fleet's Prometheus for `gpuwatch tui`'s Fleet screen and `gpuwatch pick`.
    prometheus_url: str = ""  # e.g. "http://prometheus:9090"; empty = no fleet view
    prometheus_timeout: float = 3.0  # seconds a refresh or a pick waits for Prometheus

    # Alert delivery (gpuwatch/alerts). Empty paths mean the mode's default (gpuwatch.base.paths).
    notify_db: str = ""  # subscriptions and delivery state; private to its owner (mode 0600)
    notify_socket: str = ""  # the notify service's socket; default /run/gpuwatch-notify/notify.sock
    notify_admin_file: str = ""  # admin-wide subscriptions; default /etc/gpuwatch/notify.toml
    notify_group_seconds: float = (
        5.0  # per subscription: at most one message per this window, alerts between grouped
    )
    notify_terminals: bool = False  # also a line on your logged-in terminals (user daemon, `gpuwatch run`)

    # Client.
    memory_stats_every: int = 50  # full torch.cuda.memory_stats() every N steps
    record_memory_history: bool = False  # OOM postmortems get allocation stacks; slows allocation-heavy steps
    memory_history_entries: int = 100000
    profile_wait: int = 0
    profile_warmup: int = 0
    profile_active: int = 0  # 0 = no scheduled profiling
    profile_repeat: int = 1
    profile_max_mb: float = 200.0

    # Where each value came from, for error messages and `gpuwatch config`.
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def db_path(self) -> Path:
        return Path(self.db) if self.db else paths.default_db_path(self.system)

    @property
    def socket_path(self) -> Path:
        return Path(self.socket) if self.socket else paths.default_socket_path(self.system)

    @property
    def spool_path(self) -> Path:
        return Path(self.spool_dir) if self.spool_dir else paths.spool_dir(self.system)

    @property
    def notify_db_path(self) -> Path:
        return Path(self.notify_db) if self.notify_db else paths.notify_db_path(self.system)

    @property
    def notify_socket_path(self) -> Path:
        return Path(self.notify_socket) if self.notify_socket else paths.SYSTEM_NOTIFY_SOCKET

    @property
    def runs_path(self) -> Path:
        return Path(self.runs_dir) if self.runs_dir else paths.state_dir(self.system) / "runs"


_FIELDS = {f.name: f for f in fields(Config) if f.name != "sources"}


def _coerce(key: str, value: Any, origin: str) -> Any:
    kind = _FIELDS[key].type
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if isinstance(value, (dict, list)):
            raise ValueError
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{origin}: {key} must be {kind}, got {value!r}") from None


def _read_file(path: Path) -> dict[str, Any]:
    if tomllib is None:
        if path.exists():
            raise ConfigError(f"{path}: reading it on Python 3.10 needs tomli (pip install tomli)")
        return {}
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except PermissionError:
        raise ConfigError(f"{path}: not readable") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    for key in data:
        if key not in _FIELDS:
            raise ConfigError(f"{path}: unknown key '{key}'")
    return {k: _coerce(k, v, str(path)) for k, v in data.items()}


def user_file() -> Path:
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    return Path(explicit) if explicit else paths.user_config_file()


def load(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    system_file: Path = paths.SYSTEM_CONFIG_FILE,
) -> Config:
    """Build the config from every layer; flags whose value is None are treated as not given."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    def apply(layer: Mapping[str, Any], origin: str) -> None:
        for key, value in layer.items():
            values[key] = value
            sources[key] = origin

    apply(_read_file(system_file), str(system_file))
    ufile = user_file()
    apply(_read_file(ufile), str(ufile))
    env_layer = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_CONFIG_ENV:
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in _FIELDS:
            raise ConfigError(f"environment: unknown key '{name}'")
        env_layer[key] = _coerce(key, raw, f"environment {name}")
    apply(env_layer, "environment")
    flag_layer = {}
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in _FIELDS:
            raise ConfigError(f"flags: unknown key '{key}'")
        flag_layer[key] = _coerce(key, value, f"--{key.replace('_', '-')}")
    apply(flag_layer, "flags")
    return dataclasses.replace(Config(), **values, sources=sources)

"""Admin-wide subscriptions: a TOML file only root may read (/etc/gpuwatch/notify.toml, handed
to the notify service as a systemd credential), because gpuwatch.toml is read by every user.

    [[subscription]]
    url = "slack://..."
    on = ["gpu.*", "disk.low"]   # optional; default: every GPU kind and disk.low
"""

from __future__ import annotations

import os
from pathlib import Path

import tomllib

from gpuwatch.alerts import subscriptions as subs


def load(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """[(url, kinds)]; [] when there is no file. A file others can read, or a wrong entry, is a
    SubscriptionError naming the file (never the URL)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return []
    except PermissionError:
        raise subs.SubscriptionError(f"{path}: not readable by the notify service") from None
    except tomllib.TOMLDecodeError as e:
        raise subs.SubscriptionError(f"{path}: invalid TOML: {e}") from None
    if mode & 0o077 and not os.environ.get("CREDENTIALS_DIRECTORY"):
        raise subs.SubscriptionError(
            f"{path} is readable by other users; its URLs are secrets (chmod 600 {path})"
        )
    entries = []
    unknown = set(data) - {"subscription"}
    if unknown:
        raise subs.SubscriptionError(f"{path}: unknown key {sorted(unknown)[0]!r} (only [[subscription]])")
    for n, entry in enumerate(data.get("subscription", []), 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str) or set(entry) - {"url", "on"}:
            raise subs.SubscriptionError(f'{path}: subscription {n} needs url = "..." and at most on = [...]')
        on = entry.get("on")
        kinds = subs.parse_kinds(
            ",".join(on) if isinstance(on, list) else on, subs.ADMIN_KINDS, default=subs.ADMIN_KINDS
        )
        entries.append((entry["url"], kinds))
    return entries

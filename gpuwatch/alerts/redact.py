"""Show a subscription URL without its secret: the scheme, a host that is a host, the rest masked.

Webhook URLs carry their token in the path (json://host/hook/TOKEN), in the query, or in the
"host" itself (slack://TOKENA/TOKENB/...), and mailto:// carries an SMTP password: only a
host that looks like a machine's name or address is kept.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

MASK = "****"
_HOSTNAME = re.compile(r"^(localhost|[a-z0-9-]+(\.[a-z0-9-]+)+)$", re.I)


def _is_host(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return bool(_HOSTNAME.match(name))


def redact(url: str) -> str:
    """'json://127.0.0.1:8080/hook?token=x' -> 'json://127.0.0.1:8080/****'."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return MASK
    scheme = parts.scheme or "?"
    if not _is_host(host):
        return f"{scheme}://{MASK}"
    return f"{scheme}://{host}{f':{port}' if port else ''}/{MASK}"

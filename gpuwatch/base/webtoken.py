"""The random token that guards gpuwatch's loopback web servers (`tui --web`, `browse`).

The printed URL carries it once (?token=...); the server then keeps it in a cookie for the
page's scripts. One cookie per port: browsers share cookies across the ports of a host.
"""

from __future__ import annotations

import hmac
import secrets


def new_token() -> str:
    return secrets.token_urlsafe(24)


def cookie_name(port: int) -> str:
    return f"gpuwatch_token_{port}"


def token_ok(given: str | None, token: str) -> bool:
    """Constant-time comparison, so a guess learns nothing from the reply's timing."""
    return hmac.compare_digest((given or "").encode(), token.encode())


def refusal(command: str) -> str:
    """The body of the 403 a request without the token gets."""
    return f"gpuwatch: this page needs the token printed by `{command}`\n"

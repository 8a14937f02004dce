"""`gpuwatch tui --web`: the same TUI in a browser, served by textual-serve behind a token.

textual-serve starts one TUI process (`python -m gpuwatch.tui`, not the CLI) per browser tab
and drives it over a websocket. Every request needs the random token printed at start: the
printed URL carries it, and the page then holds it in a cookie for its scripts and websocket. It binds loopback unless told otherwise;
from another machine, reach it through an SSH tunnel.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shlex
import socket
import sys

from aiohttp import web
from textual_serve.server import Server

from gpuwatch.base.webtoken import cookie_name, new_token, refusal, token_ok

DEFAULT_HOST = "127.0.0.1"


class WebAddressError(ValueError):
    pass


def parse_address(text: str) -> tuple[str, int]:
    """'[HOST:]PORT' (HOST may be '[v6]') -> (host, port); loopback when no host is given."""
    host, _, port = text.strip().rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if not port.isdigit() or not 0 < int(port) <= 65535:
        raise WebAddressError(f"--web: expected [HOST:]PORT such as 8765 or 127.0.0.1:8765, got {text!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """True when every address `host` resolves to is a loopback one (unresolvable: False)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def tui_command(
    db_path: str, refresh: float, user: str | None, prometheus: str | None = None, notice: str | None = None
) -> str:
    """The shell command textual-serve runs for each browser tab: this gpuwatch's TUI, alone."""
    args = [
        sys.executable,
        "-m",
        "gpuwatch.tui",
        "--db",
        db_path,
        "--refresh",
        str(refresh),
    ]
    args += ["--user", user] if user else []
    args += ["--notice", notice] if notice else []
    return shlex.join(args + (["--prometheus", prometheus] if prometheus else []))


class TokenServer(Server):
    """textual-serve's server, refusing every request that lacks the token."""

    def __init__(self, command: str, host: str, port: int, token: str | None = None) -> None:
        super().__init__(command, host=host, port=port, title="gpuwatch")
        self.token = token or new_token()
        self.cookie = cookie_name(port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()

        @web.middleware
        async def require_token(request: web.Request, handler):
            given = request.query.get("token") or request.cookies.get(self.cookie, "")
            if not token_ok(given, self.token):
                return web.Response(status=403, text=refusal("gpuwatch tui --web"))
            response = await handler(request)
            if request.path == "/":
                response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
            return response

        app.middlewares.append(require_token)
        return app

    async def handle_index(self, request: web.Request):
        # The page's script and websocket addresses follow the address the browser used (an
        # SSH tunnel's local port), not the one we bound. No await runs between this and the
        # page being rendered, so concurrent requests cannot mix their addresses.
        self.public_url = f"{request.scheme}://{request.host}"
        return await super().handle_index(request)

    async def on_startup(self, app: web.Application) -> None:
        self._announcing = asyncio.create_task(self._announce())

    def serve(self, debug: bool = False) -> None:
        # A port in use must fail before _announce could find the other server listening there.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((self.host, self.port))
        super().serve(debug)

    async def _announce(self) -> None:
        # Start-up hooks run before the socket listens: print the address once it answers.
        while True:
            try:
                _, writer = await asyncio.open_connection(self.host, self.port)
            except OSError:
                await asyncio.sleep(0.02)
                continue
            writer.close()
            break
        print(f"gpuwatch tui --web: open {self.url}\n(the token is needed; Ctrl+C stops)", flush=True)

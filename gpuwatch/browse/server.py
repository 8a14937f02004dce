"""Datasette over the gpuwatch database: read-only, loopback only, behind a printed token.

Read-only three ways: the database is opened `mode=ro` (or, where no writer has it open and
we may not create its -shm, as an immutable snapshot, like `open_ro`); Datasette runs only
SELECT statements; and anything but GET/HEAD is refused before Datasette sees it.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Awaitable, Callable
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from datasette import hookimpl
from datasette.app import Datasette
from datasette.utils.asgi import asgi_send

from gpuwatch.base.webtoken import cookie_name, new_token, refusal, token_ok
from gpuwatch.browse import metadata as meta
from gpuwatch.store import open_ro

HOST = "127.0.0.1"
COMMAND = "gpuwatch browse"
PLUGIN = "gpuwatch-charts"

# ASGI's shapes, written out: Datasette and uvicorn ship no types.
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def require_token(app: ASGIApp, token: str, port: int) -> ASGIApp:
    """ASGI middleware: a request needs the token (?token= once, then the cookie); the URL
    carrying it is answered by a redirect to the same URL without it, the cookie set."""
    cookie = cookie_name(port)

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await app(scope, receive, send)
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        given = dict(query).get("token")
        if given is None:
            jar = SimpleCookie()
            for name, value in scope.get("headers", []):
                if name == b"cookie":
                    jar.load(value.decode("latin-1"))
            given = jar[cookie].value if cookie in jar else None
        if not token_ok(given, token):
            await asgi_send(send, refusal(COMMAND), 403, content_type="text/plain; charset=utf-8")
            return
        if scope["method"] not in ("GET", "HEAD"):
            await asgi_send(
                send, "gpuwatch browse is read-only\n", 405, content_type="text/plain; charset=utf-8"
            )
            return
        if dict(query).get("token") is not None:
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = scope["path"] + (f"?{rest}" if rest else "")
            await asgi_send(
                send,
                "",
                302,
                headers={
                    "location": location,
                    "set-cookie": f"{cookie}={token}; Path=/; HttpOnly; SameSite=Strict",
                },
            )
            return
        return await app(scope, receive, send)

    return guarded


@hookimpl  # type: ignore[untyped-decorator]  # datasette ships no types; the marker returns the function
def extra_body_script(datasette: Datasette) -> str:
    """This module is also a Datasette plugin: a canned query's page opens with its chart
    (datasette-vega reads its settings from the URL fragment; one already there is kept)."""
    charts = {
        datasette.urls.query(db, name): meta.chart_fragment(q["chart"])
        for db in datasette.databases
        for name, q in meta.QUERIES.items()
    }
    return (
        "(function(){var c=%s[location.pathname];if(c&&!location.hash)"
        "history.replaceState(null,'',location.pathname+location.search+'#'+c);})();" % json.dumps(charts)
    )


def make_app(db_path: str | Path, token: str, port: int) -> tuple[Datasette, ASGIApp]:
    """The ASGI app: Datasette over `db_path` with gpuwatch's metadata and charts, guarded."""
    from datasette.plugins import pm

    db_path = Path(db_path)
    probe = open_ro(db_path)  # the store's rules: version check, and whether it must be immutable
    try:
        frozen = probe.frozen
        table_columns = {
            name: [r[1] for r in probe.execute(f"PRAGMA table_info([{name}])")]
            for (name,) in probe.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        }
    finally:
        probe.close()
    db_name = db_path.stem
    ds = Datasette(
        files=[] if frozen else [str(db_path)],
        immutables=[str(db_path)] if frozen else [],
        metadata=meta.metadata(db_name, table_columns),
        settings={"default_page_size": 200, "sql_time_limit_ms": 5000, "allow_download": False},
    )
    if not pm.has_plugin(PLUGIN):
        pm.register(sys.modules[__name__], name=PLUGIN)
    return ds, require_token(ds.app(), token, port)


def serve(db_path: str | Path, port: int) -> None:
    """Serve until Ctrl+C; prints the URL (with the token) once the socket listens."""
    import asyncio

    import uvicorn

    token = new_token()
    sock = socket.socket(socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(128)
    port = sock.getsockname()[1]
    ds, app = make_app(db_path, token, port)
    asyncio.run(ds.invoke_startup())
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    print(
        f"gpuwatch browse: open http://{HOST}:{port}/?token={token}\n"
        f"(read-only; the token is needed; Ctrl+C stops)",
        flush=True,
    )
    server.run(sockets=[sock])

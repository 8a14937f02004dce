"""Loopback endpoints that apprise really delivers to: a JSON webhook (json://) whose outage a
test can switch on and off, and an SMTP server (mailto://, aiosmtpd)."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time


class Hook:
    """POSTs to http://127.0.0.1:PORT/... recorded as (monotonic time, JSON body); `down` makes
    it answer 503, as a webhook service in an outage does."""

    def __init__(self):
        self.received: list[tuple[float, dict]] = []
        self.refused = 0
        self.refused_bodies: list[dict] = []
        self.down = False
        hook = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hook.down:
                    hook.refused += 1
                    hook.refused_bodies.append(json.loads(body))
                    self.send_response(503)
                else:
                    hook.received.append((time.monotonic(), json.loads(body)))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, secret: str = "s3cret-token") -> str:
        return f"json://127.0.0.1:{self.port}/hook/{secret}?token={secret}"

    def texts(self) -> list[str]:
        return [m["title"] + "\n" + m["message"] for _, m in self.received]

    def count(self, needle: str) -> int:
        return sum(text.count(needle) for text in self.texts())

    def refused_count(self, needle: str) -> int:
        return sum((m["title"] + "\n" + m["message"]).count(needle) for m in self.refused_bodies)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Mailbox:
    """A loopback SMTP server; messages as email.message.Message."""

    def __init__(self):
        from aiosmtpd.controller import Controller
        from aiosmtpd.handlers import Message

        self.messages = []
        box = self

        class Keep(Message):
            def handle_message(self, message):
                box.messages.append(message)

        with socket.socket() as probe:  # aiosmtpd checks it is up by connecting: no port 0
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.controller = Controller(Keep(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def url(self) -> str:
        return f"mailto://localhost:{self.port}?to=owner@example.com&from=gpuwatch@example.com"

    def close(self):
        self.controller.stop()

"""With no daemon, `gpuwatch run` serves its child's events itself.

The child (whatever its interpreter) then sends over a Unix socket exactly as it would to a
daemon, and this process writes those events with the daemon's own ingest code into the
embedded database it already holds. The GPU/host sampler stays in this process too: the
training process carries no sampler thread and no database writer.

`python -m gpuwatch.cli.private_ingest SOCKET` does the same for a training process that has no
wrapper (track() or gpuwatch.autolog() with no daemon; gpuwatch.client.helpers starts it): a
helper at nice +10 that serves SOCKET until the process that started it has exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import socket
import sys
import threading
from pathlib import Path

from gpuwatch.base.config import Config
from gpuwatch.daemon.ingest import IngestServer
from gpuwatch.store import Writer


class PrivateIngest:
    """The daemon's IngestServer on `path`, on an event loop in a thread of its own. `listening`:
    the socket already bound there, whose waiting connections it then serves."""

    def __init__(self, cfg: Config, writer: Writer, path: Path, listening: socket.socket | None = None):
        self.path = path
        # Out of the training process there is no GIL to leave it: commit (and so acknowledge)
        # at once, and the program's last flush before it exits does not wait for a linger.
        writer.linger_s = 0.0
        self._server = IngestServer(
            dataclasses.replace(cfg, socket=str(path), system=False), writer, mode="embedded"
        )
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._error: BaseException | None = None

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            # The daemon's start() raises the open-files limit; the child would inherit that.
            files = resource.getrlimit(resource.RLIMIT_NOFILE)
            try:
                self._loop.run_until_complete(self._server.start(listening))
            except BaseException as e:  # noqa: BLE001 — reported to the caller below
                self._error = e
                started.set()
                return
            finally:
                resource.setrlimit(resource.RLIMIT_NOFILE, files)
            started.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._server.stop())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="gpuwatch-run-ingest", daemon=True)
        self._thread.start()
        started.wait()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop serving once every connection had its chance to deliver (the child has exited)."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)


def _main(socket_path: str) -> None:
    from gpuwatch.base.config import load
    from gpuwatch.cli.our_lines import prefix_our_log_lines
    from gpuwatch.client import helpers
    from gpuwatch.client.transport import EmbeddedTransport

    prefix_our_log_lines()
    helpers.lower_priority()
    cfg = load()
    transport = EmbeddedTransport(cfg)
    try:
        ingest = PrivateIngest(cfg, transport.writer, Path(socket_path))
        print("ready", flush=True)
        helpers.wait_for_parent_exit()
        ingest.close()
    finally:
        transport.close()
        # The server removed its socket when it stopped (unless it never started): then the
        # private directory helpers.recorder_socket made for it.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path)
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(socket_path))


if __name__ == "__main__":
    _main(sys.argv[1])

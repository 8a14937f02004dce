"""The daemon process: an asyncio loop in the main thread, the sampler in its own thread.

Start-up: open the store (one Writer), start the sampler, start the servers that live on the
loop, then tell systemd READY=1. SIGTERM/SIGINT: STOPPING=1, stop the servers, stop the
sampler, flush and close the writer, exit 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import threading
from functools import partial
from typing import Callable, Mapping

from gpuwatch.base.config import Config, ConfigError
from gpuwatch.daemon.ingest import IngestServer
from gpuwatch.daemon.notify import Notifier
from gpuwatch.daemon.spool import SpoolAdopter
from gpuwatch.daemon.stalls import StallWatch
from gpuwatch.monitor.runs_watch import RunsWatch
from gpuwatch.monitor.sampler import Sampler
from gpuwatch.store import SQLiteError, StoreError, Writer, health

log = logging.getLogger("gpuwatch.daemon")


def default_system_mode(environ: Mapping[str, str] | None = None) -> bool:
    """System mode when started by systemd with a StateDirectory, or by root; else per-user."""
    env = os.environ if environ is None else environ
    return bool(env.get("STATE_DIRECTORY")) or os.geteuid() == 0


def resolve_mode(cfg: Config) -> Config:
    """Apply the default mode unless a flag, the environment or a file chose one."""
    if "system" in cfg.sources:
        return cfg
    return dataclasses.replace(cfg, system=default_system_mode())


class Daemon:
    def __init__(
        self, cfg: Config, nvml_module: object | None = None, notifier: Notifier | None = None
    ) -> None:
        """`nvml_module`: pynvml, or a stand-in with its functions (tests)."""
        self.cfg = cfg
        self.notifier = notifier or Notifier()
        self.writer = Writer(cfg.db_path)
        # While the database cannot be written, readers learn why from a report beside the socket.
        self.writer.on_health = partial(health.publish, cfg.socket_path)
        try:
            # run.stalled comes from the stall watch below, with the stacks it dumps
            self.sampler = Sampler(self.writer, cfg, nvml_module=nvml_module, alert_stalls=False)
        except BaseException:
            self.writer.close()
            raise
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        # Shutdown steps of the servers started on the loop, run in reverse order on stop.
        self._on_stop: list[Callable[[], object]] = []
        if cfg.metrics_listen:
            # /metrics serves from its own thread; started here so a bad address fails start-up.
            from gpuwatch.daemon.metrics import start_metrics_server

            try:
                metrics = start_metrics_server(
                    cfg.metrics_listen,
                    cfg.db_path,
                    extra=lambda: {
                        "writer_queue_depth": self.writer.depth(),
                        "writer_failed_jobs": self.writer.failed_jobs,
                        "store_writable": int(self.writer.health is None),
                        "dropped_samples_total": self.sampler.dropped_samples,
                    },
                    hostname=cfg.metrics_hostname or None,
                )
            except BaseException:
                self.writer.close()
                raise
            log.info("serving Prometheus metrics on %s", metrics.url)
            self._on_stop.append(metrics.close)

    def request_stop(self) -> None:
        """Ask the daemon to stop; safe from any thread."""
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)

    async def serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.loop.add_signal_handler(sig, self._stop.set)
        self.sampler.start()
        try:
            # Servers that run on this loop (socket ingest, /metrics) start here and append
            # their shutdown to self._on_stop.
            ingest = IngestServer(self.cfg, self.writer)
            await ingest.start()
            self._on_stop.append(ingest.stop)
            runs_watch = RunsWatch(self.writer)
            runs_watch.start()
            self._on_stop.append(runs_watch.stop)
            # Events spooled by clients that ended or died while the daemon was away.
            adopter = SpoolAdopter(self.cfg, self.writer)
            adopter.start()
            self._on_stop.append(adopter.stop)
            rules = self.sampler.rules
            stall_watch = StallWatch(
                self.writer,
                self.cfg,
                on_stall=lambda stalled, row: self.writer.submit(rules.stall_job(stalled, row), block=False),
            )
            stall_watch.start()
            self._on_stop.append(stall_watch.stop)
            if not self.cfg.system:
                # A user daemon delivers its owner's alerts itself; a system one stays fenced
                # off the network and leaves delivery to gpuwatch-notify.service.
                from gpuwatch.alerts.deliver import Deliverer
                from gpuwatch.alerts.subscriptions import SubscriptionError

                try:
                    deliverer = Deliverer(
                        self.cfg.notify_db_path,
                        self.cfg.db_path,
                        self.cfg.notify_group_seconds,
                        terminals_uid=os.getuid() if self.cfg.notify_terminals else None,
                    )
                except (SubscriptionError, OSError, SQLiteError) as e:  # sampling matters more
                    log.error("alerts will not be delivered: %s", e)
                else:
                    deliverer.start()
                    self._on_stop.append(deliverer.stop)
            status = f"{self.sampler.status_line()}; db {self.cfg.db_path}"
            # The host-only reason was logged once already; systemctl status shows it in STATUS.
            log.info("started: %s GPUs; db %s", self.sampler.gpu_count, self.cfg.db_path)
            self.notifier.ready(status)
            watchdog = asyncio.create_task(self._feed_watchdog())
            await self._stop.wait()
            watchdog.cancel()
            log.info("stopping")
        finally:
            # Also reached when a server fails to start: whatever did start is stopped.
            self.notifier.stopping()
            for stop in reversed(self._on_stop):
                try:
                    result = stop()
                    if asyncio.iscoroutine(result):
                        await result
                except Exception:
                    log.exception("stopping %s failed", stop)
            self.sampler.stop()
            self.writer.close()
            health.publish(self.cfg.socket_path, None)
            self.notifier.close()
        log.info("stopped")

    async def _feed_watchdog(self) -> None:
        """WATCHDOG=1 every WATCHDOG_USEC/2, only while the sampler keeps ticking."""
        period = self.notifier.watchdog_interval_s
        if not period:
            return
        reported_stall = False
        while True:
            await asyncio.sleep(period)
            if self.sampler.healthy():
                self.notifier.watchdog()
                reported_stall = False
            elif not reported_stall:
                log.error("sampler stalled: not feeding the watchdog")
                self.notifier.status("sampler stalled")
                reported_stall = True


def run_daemon(cfg: Config, nvml_module: object | None = None) -> int:
    """Run until SIGTERM/SIGINT; returns the exit status. `nvml_module` is for tests only."""
    try:
        daemon = Daemon(cfg, nvml_module=nvml_module)
    except (StoreError, ConfigError, OSError) as e:
        log.error("cannot start: %s", e)
        return 1
    try:
        asyncio.run(daemon.serve())
    except (StoreError, ConfigError, OSError) as e:  # e.g. the socket is held by another daemon
        log.error("failed: %s", e)
        return 1
    return 0

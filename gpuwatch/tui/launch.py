"""Open the TUI on a database: the one start that `gpuwatch tui`, `gpuwatch demo` and the browser
tabs of `gpuwatch tui --web` (`python -m gpuwatch.tui`) share. Textual is imported only here,
when the app starts."""

from __future__ import annotations

import gc
import sys
from typing import Callable

from gpuwatch.base.config import Config


class LaunchError(Exception):
    """The TUI cannot start; the message is one line."""


def stale_after_ms(cfg: Config, refresh: float) -> int:
    """Data older than three sampling intervals (or refreshes): the daemon is away."""
    return int(3000 * max(cfg.interval, cfg.host_interval, refresh))


def run(
    path: str,
    refresh: float = 1.0,
    user: str | None = None,
    start_mode: str = "overview",
    prometheus_url: str | None = None,
    prometheus_timeout: float = 3.0,
    notice: str | None = None,
    stale_after_ms: int = 15_000,
    before_run: Callable[[], None] | None = None,
) -> int:
    """Run the TUI on the database at `path` until it quits; its exit code. `start_mode` is
    "overview", "runs" or "fleet" (the Fleet screen reads `prometheus_url`). Raises StoreError
    (a wrong path or schema), ConfigError or LaunchError, one line each."""
    from gpuwatch.base import config, spool
    from gpuwatch.store import open_ro

    if start_mode != "fleet":  # a login node may have no store of its own, only the fleet
        open_ro(path).close()  # a wrong path or schema is one clear line, not a screen of errors

    if not (prometheus_url or "").startswith("https:"):
        # asyncio loads TLS support if it can: 4 MB of a TUI that opens no TLS connection, on
        # a server where twenty people may keep one open.
        sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.source import StoreSource

    fleet = None
    if prometheus_url:  # an HTTP client only for a fleet to read
        from gpuwatch.fleet.prometheus import PrometheusError
        from gpuwatch.tui.fleet_source import PrometheusSource

        try:
            fleet = PrometheusSource(prometheus_url, prometheus_timeout)
        except PrometheusError as e:
            raise LaunchError(str(e)) from None

    source = StoreSource(
        path,
        stale_after_ms=stale_after_ms,
        notice=notice,
        spool_dirs=spool.reader_dirs(config.load().spool_path),
    )
    app = GpuwatchApp(source, refresh_s=refresh, user=user, start_mode=start_mode, fleet=fleet)
    # Textual's rendered lines (Strips) keep themselves in their own caches, so each repaint
    # leaves cycles that only a full collection frees, and Python runs one only every ~70,000
    # allocations: a TUI left open swung 5-8 MB above its need. What the imports built is never
    # garbage: freeze it, and collect the rest fully every ~7,000 allocations (a few ms).
    if before_run is not None:
        before_run()
    gc.collect()
    gc.freeze()
    gc.set_threshold(700, 10, 1)
    app.run()
    return app.return_code or 0

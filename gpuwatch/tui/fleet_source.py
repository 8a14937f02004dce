"""The Fleet screen's data source: Prometheus, read-only, turned into snapshots (in the poll thread)."""

from __future__ import annotations

from typing import Callable

from gpuwatch.fleet.model import read_fleet
from gpuwatch.fleet.prometheus import DEFAULT_TIMEOUT_S, Prometheus, PrometheusError
from gpuwatch.store import now_ms
from gpuwatch.tui.snapshot import Snapshot, View


class PrometheusSource:
    def __init__(
        self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, clock: Callable[[], int] = now_ms
    ) -> None:
        self.prom = Prometheus(url, timeout_s)
        self.clock = clock

    def close(self) -> None:
        self.prom.close()

    def fetch(self, view: View) -> Snapshot:
        now = self.clock()
        try:
            fleet = read_fleet(self.prom, jobs=view.kind == "fleet_jobs")
        except PrometheusError as e:
            return Snapshot(now_ms=now, problem=str(e))
        return Snapshot(now_ms=now, data_ms=now, fleet=fleet)

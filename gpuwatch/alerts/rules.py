"""The alert rules: what gpuwatch sees becomes alert rows (gpuwatch/store/alerts.py), one per
incident, wherever the sampler runs (the daemon, or `gpuwatch run`'s wrapper with no daemon).

Two ways in, both cheap for the sampling loop:
- `gpu_job(...)`: each GPU tick the sampler hands over what it just read (samples, processes,
  XIDs); the facts are computed from those, in memory, and the job rides in the tick's own
  writer transaction. It touches the database only when an episode begins, fires or ends.
- `check(conn)`: every CHECK_INTERVAL_S a writer job looks at what other parts wrote: runs that
  ended, stalled runs that stepped again (and, with no daemon's stall watch, stalled runs), slow
  runs, the database's disk, and wishes for free GPUs. Each look is an indexed query of a few
  rows, not a scan of the samples.

The daemon's stall watch hands its stalls (with their stacks) to `stall_job`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuwatch.alerts import gpu_rules, host_rules, run_rules
from gpuwatch.alerts.episodes import Episodes
from gpuwatch.alerts.stalled_runs import Stalled, find_stalled
from gpuwatch.base.config import Config
from gpuwatch.store import SQLiteError
from gpuwatch.store import alerts as stored
from gpuwatch.store.alerts import Alert

if TYPE_CHECKING:
    import sqlite3

    from collectors.nvml import GpuProcessSample, GpuSample, GpuStatic, XidEvent

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 2.0  # run ends, recoveries, stalls: an alert ≤ this (+ a commit) after the row
SLOW_CHECK_MS = 10_000  # run.slow reads a run's recent steps: less often
WISH_CHECK_MS = 5_000  # gpus.free reads the last minutes of GPU samples, when someone wishes


class AlertRules:
    def __init__(self, cfg: Config, host: str, clock: Callable[[], int], detect_stalls: bool = True):
        """`detect_stalls`: raise run.stalled from the runs table here (no daemon's stall watch
        runs: `gpuwatch run` with no daemon); the daemon passes False and calls stall_job."""
        self.cfg = cfg
        self.host = host
        self.clock = clock
        self.detect_stalls = detect_stalls
        self.episodes = Episodes()  # writer thread only
        self.run_ends = run_rules.RunEnds(host)  # writer thread only
        self.errors = gpu_rules.ErrorCounts()  # sampler thread only
        self._next_slow = self._next_wish = 0
        self._failed_rules: set[str] = set()  # logged once each

    def forget(self) -> None:
        """A write of ours was rolled back: reload state from the database before the next pass
        (an episode marked fired in memory only would never alert)."""
        self.episodes = Episodes()
        self.run_ends = run_rules.RunEnds(self.host)

    def _record(self, conn: sqlite3.Connection, alert: Alert | None) -> None:
        if alert is not None and stored.record(conn, alert) is not None:
            # debug: the row is the record (`gpuwatch alerts`); the journal keeps the sampler's
            # own warnings (a GPU hung, then answering again) as its only lines about a GPU
            log.debug("alert %s: %s", alert.kind, alert.title)

    def _guarded(
        self, name: str, conn: sqlite3.Connection, rule: Callable[[], Sequence[Alert | None]]
    ) -> None:
        """Run one rule and record its alerts; a rule's bug is logged once and spares the others."""
        try:
            for alert in rule():
                self._record(conn, alert)
        except SQLiteError:
            raise  # the file's trouble, not the rule's: the writer reports it
        except Exception:
            if name not in self._failed_rules:
                self._failed_rules.add(name)
                log.exception("alert rule %s failed (logged once)", name)

    # --- each GPU tick (sampler thread builds, writer thread runs) ---

    def gpu_job(
        self,
        ts: int,
        statics: Sequence[GpuStatic],
        samples: Sequence[GpuSample],
        procs: Sequence[GpuProcessSample],
        pid_facts: Mapping[int, tuple[Any, ...]],
        xids: Sequence[XidEvent],
    ) -> Callable[[sqlite3.Connection], None]:
        facts = gpu_rules.gpu_facts(self.host, self.cfg, statics, samples, procs, pid_facts)
        unsampled = gpu_rules.unsampled(statics, samples)
        instant = self.errors.alerts(self.host, ts, statics, samples, xids)

        def held(conn: sqlite3.Connection) -> list[Alert]:
            found: list[Alert] = []
            holding = {k for k in self.episodes.open_keys(conn, "gpu.") if gpu_rules.key_gpu(k) in unsampled}
            for fact in facts:
                holding.add(fact.key)
                since = self.episodes.hold(conn, fact.key, ts, fact.hold_ms)
                if since is not None:
                    found.append(fact.alert(since, ts))
            self.episodes.release_others(conn, "gpu.", holding)
            return found

        def job(conn: sqlite3.Connection) -> None:
            self._guarded("gpu errors", conn, lambda: instant)
            self._guarded("gpu episodes", conn, lambda: held(conn))

        return job

    # --- every CHECK_INTERVAL_S (writer thread) ---

    def check(self, conn: sqlite3.Connection) -> None:
        now = self.clock()
        if self.detect_stalls:
            self._guarded(
                "stalls",
                conn,
                lambda: [
                    run_rules.stalled_alert(conn, s) for s in find_stalled(conn, self.cfg, self.host, now)
                ],
            )
        # Before the ends: a run that stepped again and ended since the last pass recovered first.
        self._guarded("recoveries", conn, lambda: run_rules.recovered_alerts(conn, self.host))
        self._guarded(
            "run ends",
            conn,
            lambda: [run_rules.ended_alert(conn, run_id) for run_id in self.run_ends.ended(conn, now)],
        )
        if now >= self._next_slow:
            self._next_slow = now + SLOW_CHECK_MS
            self._guarded(
                "slow runs",
                conn,
                lambda: run_rules.slow_alerts(conn, self.cfg, self.host, now, self.episodes),
            )
        self._guarded(
            "disk", conn, lambda: [host_rules.disk_low_alert(conn, self.cfg, self.host, now, self.episodes)]
        )
        if now >= self._next_wish:
            self._next_wish = now + WISH_CHECK_MS
            self._guarded("wishes", conn, lambda: host_rules.granted_alerts(conn, self.host, now))

    def stall_job(self, stalled: Stalled, dump_row: dict[str, Any]) -> Callable[[sqlite3.Connection], None]:
        """run.stalled for a stall the daemon's stall watch found and dumped."""
        return lambda conn: self._guarded(
            "stalls",
            conn,
            lambda: [
                run_rules.stalled_alert(conn, stalled, dump_row.get("stacks_json"), dump_row.get("error"))
            ],
        )

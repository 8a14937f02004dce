"""The Prometheus endpoint: a collector that reads the newest stored samples on each scrape.

No NVML call happens on the scrape path; the sampler has already stored everything. GPU metrics
use dcgm-exporter's names, units and labels so existing dashboards and alerts work unchanged.
dcgm-exporter's counters are exposed untyped: prometheus-client would rename a counter to
`<name>_total`, which would break those dashboards; rate() works on untyped series alike.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from gpuwatch.base.config import ConfigError
from gpuwatch.store import SQLiteError, StoreError, now_ms, open_ro, queries, scrape
from gpuwatch.store.energy import EnergyLedger
from gpuwatch.store.queries import PROCESS_TICK_SLACK_MS
from gpuwatch.store.running import running_runs

if TYPE_CHECKING:
    from sqlite3 import Connection
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import GaugeMetricFamily, Metric, UnknownMetricFamily

DEFAULT_HOST = "127.0.0.1"
MIB = 1024 * 1024
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
# Hostname is on every series a fleet view groups by host (dcgm-exporter's label): `instance`
# is the scrape address, which says nothing once a target is behind a proxy or renamed.
USER_LABELS = ("gpu", "UUID", "Hostname", "user")
RUN_LABELS = ("run_id", "name", "user", "job_id", "rank", "Hostname")
MAX_USERS_PER_GPU = 8  # the rest of a GPU's users are summed as "(others)": bounded cardinality
OTHERS = "(others)"
# NVML clock-event reasons that slow a GPU against its will (power cap, HW slowdown, sync boost,
# SW/HW thermal, power brake); idle and application-clock settings are normal operation.
THROTTLED_MASK = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80

# (dcgm name, gpu_samples column, scale to dcgm's unit, kind, help) — help text as dcgm-exporter's.
DCGM_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1, "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", 1, "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c", 1, "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_mw", 1 / 1000, "gauge", "Power draw (in W)."),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "energy_mj",
        1,
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util_pct", 1, "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util_pct", 1, "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "mem_free_bytes", 1 / MIB, "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "mem_used_bytes", 1 / MIB, "gauge", "Framebuffer memory used (in MiB)."),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "ecc_corrected",
        1,
        "counter",
        "Total number of single-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "ecc_uncorrected",
        1,
        "counter",
        "Total number of double-bit volatile ECC errors.",
    ),
)
# A MIG device's own figures, as series of these DCGM families labelled as dcgm-exporter labels a
# GPU instance: its GPU's labels plus GPU_I_PROFILE and GPU_I_ID. Temperature, power and clocks
# are the whole GPU's and stay on its series, which carry no GPU_I_* labels.
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
MIG_FIELDS = (
    ("DCGM_FI_DEV_FB_USED", "mem_used_bytes", 1 / MIB),
    ("DCGM_FI_DEV_FB_FREE", "mem_free_bytes", 1 / MIB),
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util_pct", 1),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util_pct", 1),
)
_COMPUTE_SHARE = re.compile(r"^\d+c\.")  # "1c.3g.40gb": a compute instance's share of 3g.40gb
# GPM figures (Hopper and later) under DCGM's profiling names, as its 0-1 ratios:
# (dcgm name, gpu_prof_samples column, help as dcgm-exporter's).
PROF_FIELDS = (
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "sm_active_pct",
        "The ratio of cycles an SM has at least 1 warp assigned (in %).",
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "sm_occupancy_pct",
        "The ratio of number of warps resident on an SM (in %).",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "tensor_active_pct",
        "Ratio of cycles the tensor (HMMA) pipe is active (in %).",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "dram_active_pct",
        "Ratio of cycles the device memory interface is active sending or receiving data (in %).",
    ),
)

# NVML gives PCIe throughput as a rate, not dcgm's cumulative KB counter, so it gets our own name.
OWN_GPU_FIELDS = (
    ("gpuwatch_gpu_pcie_tx_bytes_per_second", "pcie_tx_kbps", 1024, "PCIe transmit throughput."),
    ("gpuwatch_gpu_pcie_rx_bytes_per_second", "pcie_rx_kbps", 1024, "PCIe receive throughput."),
    ("gpuwatch_gpu_fan_percent", "fan_pct", 1, "Fan speed (in %)."),
    ("gpuwatch_gpu_sample_age_seconds", "age_ms", 1 / 1000, "Seconds since this GPU was last sampled."),
)
HOST_FIELDS = (
    ("gpuwatch_host_cpu_percent", "cpu_pct", 1, "Host CPU utilisation (in %)."),
    ("gpuwatch_host_load1", "load1", 1, "Host 1-minute load average."),
    ("gpuwatch_host_memory_total_bytes", "mem_total_bytes", 1, "Host memory."),
    ("gpuwatch_host_memory_used_bytes", "mem_used_bytes", 1, "Host memory in use."),
    ("gpuwatch_host_memory_available_bytes", "mem_available_bytes", 1, "Host memory available."),
    ("gpuwatch_host_swap_used_bytes", "swap_used_bytes", 1, "Swap in use."),
    ("gpuwatch_host_shm_total_bytes", "shm_total_bytes", 1, "Size of /dev/shm."),
    ("gpuwatch_host_shm_used_bytes", "shm_used_bytes", 1, "/dev/shm in use."),
)
DAEMON_FIELDS = (
    ("gpuwatch_daemon_cpu_percent", "cpu_pct", 1, "CPU used by the gpuwatch daemon (in %)."),
    ("gpuwatch_daemon_rss_bytes", "rss_bytes", 1, "Resident memory of the gpuwatch daemon."),
    ("gpuwatch_daemon_tick_seconds", "tick_ms", 1 / 1000, "Duration of the last sampler tick."),
    ("gpuwatch_daemon_writer_queue_depth", "queue_depth", 1, "Jobs waiting for the database writer."),
    ("gpuwatch_daemon_dropped_events", "dropped_events", 1, "Events the daemon had to drop."),
)

# A fresh energy ledger (first scrape, or the daemon restarted) catches up on the running runs'
# history in a thread of its own, this much at a time, so no scrape waits for it; their energy
# is exported once it has caught up.
ENERGY_CATCH_UP_MS = 15 * 60_000


def _family(
    name: str, doc: str, labels: tuple[str, ...], kind: str = "gauge"
) -> GaugeMetricFamily | UnknownMetricFamily:
    from prometheus_client.core import GaugeMetricFamily, UnknownMetricFamily

    cls = UnknownMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, doc, labels=list(labels))


class StoreCollector:
    """A prometheus-client custom collector over the database the daemon writes.

    `extra` is called on each scrape for the daemon's live figures ({name: value}); each becomes
    `gpuwatch_daemon_<name>`. GPUs whose newest sample is older than `stale_after_s` are left out
    so Prometheus marks their series stale instead of repeating old values.
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        extra: Callable[[], Mapping[str, float]] | None = None,
        stale_after_s: float = 60.0,
        hostname: str | None = None,
    ):
        self.db_path = Path(db_path)
        self.extra = extra
        self.stale_after_ms = int(stale_after_s * 1000)
        self.hostname = hostname or socket.gethostname()
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # the HTTP server is threaded; one scrape reads at a time
        # run_id -> (last step folded in, peak bytes so far): each scrape reads only new steps.
        self._peaks: dict[str, tuple[int, int | None]] = {}
        self._energy: EnergyLedger | None = None  # running runs' joules, folded scrape by scrape
        self._catch_up: threading.Thread | None = None  # folds a fresh ledger's history
        self._closing = threading.Event()

    def describe(self) -> list[Metric]:
        return []  # built per scrape; stops the registry calling collect() at register time

    def collect(self) -> Iterator[Metric]:
        start = time.perf_counter()
        with self._lock:
            conn = self._connection()
            families = [] if conn is None else self._from_store(conn)
        live = self._extra_families()
        replaced = {f.name for f in live}  # a live figure from the daemon beats its stored copy
        families = [f for f in families if f.name not in replaced] + live
        up = _family("gpuwatch_store_up", "1 if the database could be read on this scrape.", ())
        up.add_metric([], 0 if conn is None else 1)
        families.append(up)
        took = _family("gpuwatch_scrape_collect_seconds", "Time spent building this scrape.", ())
        took.add_metric([], time.perf_counter() - start)
        families.append(took)
        return iter(families)

    def close(self) -> None:
        self._closing.set()
        if self._catch_up is not None:
            self._catch_up.join(timeout=5)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _connection(self) -> Connection | None:
        if self._conn is None:
            try:
                self._conn = open_ro(self.db_path)
            except StoreError:
                return None  # not created yet: exporter stays up, gpuwatch_store_up says 0
        return self._conn

    def _from_store(self, conn: Connection) -> list[Metric]:
        try:
            gpus, newest_gpu_ms = self._gpu_families(conn)
            return (
                gpus
                + self._run_families(conn, newest_gpu_ms)
                + self._host_families(conn, newest_gpu_ms)
                + [self._alerts_family(conn)]
            )
        except SQLiteError:
            self._conn = None  # reopen next time (e.g. the file was replaced)
            conn.close()
            return []

    def _gpu_families(self, conn: Connection) -> tuple[list[Metric], int | None]:
        """The GPU families, and the time of the newest GPU sample (None: none stored)."""
        now = now_ms()
        fresh_after = now - self.stale_after_ms
        latest = queries.latest_gpu_samples(conn)
        infos = queries.gpus(conn)
        rows = [
            (gpu, latest[gpu.gpu_index])
            for gpu in infos
            if gpu.state == "ok"
            and gpu.gpu_index in latest
            and latest[gpu.gpu_index].state is None
            and latest[gpu.gpu_index].ts_ms >= fresh_after
        ]
        xids = scrape.last_xids(conn)
        gpu_labels = [
            [
                str(g.gpu_index),
                g.uuid or "",
                g.pci_bus_id or "",
                f"nvidia{g.gpu_index}",
                g.name or "",
                self.hostname,
            ]
            for g, _ in rows
        ]
        values = [dict(vars(sample), age_ms=now - sample.ts_ms) for _, sample in rows]
        families: list[Metric] = []
        for name, column, scale, kind, doc in DCGM_FIELDS:
            fam = _family(name, doc, GPU_LABELS, kind)
            for labels, v in zip(gpu_labels, values):
                if v[column] is not None:
                    fam.add_metric(labels, v[column] * scale)
            families.append(fam)
        xid = _family("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", GPU_LABELS)
        for labels, (gpu, _) in zip(gpu_labels, rows):
            xid.add_metric(labels, xids.get(gpu.gpu_index, 0))
        families.append(xid)
        for name, column, scale, doc in OWN_GPU_FIELDS:
            fam = _family(name, doc, GPU_LABELS)
            for labels, v in zip(gpu_labels, values):
                if v[column] is not None:
                    fam.add_metric(labels, v[column] * scale)
            families.append(fam)
        reasons = _family(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).", GPU_LABELS
        )
        throttled = _family(
            "gpuwatch_gpu_throttled",
            "1 while power, thermal or a hardware slowdown holds the GPU's clocks down.",
            GPU_LABELS,
        )
        for labels, v in zip(gpu_labels, values):
            if v["throttle_reasons"] is not None:
                reasons.add_metric(labels, v["throttle_reasons"])
                throttled.add_metric(labels, 1 if v["throttle_reasons"] & THROTTLED_MASK else 0)
        families += [reasons, throttled, self._gpu_up(infos, rows, latest), self._users(conn, rows)]
        labels_by_gpu = {g.gpu_index: labels for (g, _), labels in zip(rows, gpu_labels)}
        _add_mig_series(conn, families, labels_by_gpu)
        families += _prof_families(conn, labels_by_gpu, fresh_after)
        return families, max((s.ts_ms for s in latest.values()), default=None)

    def _gpu_up(
        self,
        infos: list[queries.GpuInfo],
        fresh: list[tuple[queries.GpuInfo, queries.GpuSample]],
        latest: dict[int, queries.GpuSample],
    ) -> Metric:
        """Every GPU the host ever had: 0 when lost, not responding or no longer sampled (the
        `reason` label says which), so an alert can fire."""
        ok = {gpu.gpu_index for gpu, _ in fresh}
        up = _family(
            "gpuwatch_gpu_up",
            "1 while the GPU answers and is sampled; 0 when it is lost, "
            "not responding (its NVML calls block) or not sampled lately: see `reason`.",
            GPU_LABELS + ("reason",),
        )
        for g in infos:
            s = latest.get(g.gpu_index)
            state = s.state if s is not None and g.state == "ok" else g.state
            reason = (
                ""
                if g.gpu_index in ok
                else "lost"
                if state == "lost"
                else "not responding"
                if state == "hung"
                else "no recent sample"
            )
            up.add_metric(
                [
                    str(g.gpu_index),
                    g.uuid or "",
                    g.pci_bus_id or "",
                    f"nvidia{g.gpu_index}",
                    g.name or "",
                    self.hostname,
                    reason,
                ],
                1 if g.gpu_index in ok else 0,
            )
        return up

    def _users(self, conn: Connection, fresh: list[tuple[queries.GpuInfo, queries.GpuSample]]) -> Metric:
        """GPU memory per user per GPU, from the newest process tick; a GPU's users beyond
        MAX_USERS_PER_GPU are summed as "(others)"."""
        uuids = {gpu.gpu_index: gpu.uuid or "" for gpu, _ in fresh}
        held: dict[int, dict[str, int]] = {}
        for p in queries.gpu_processes(conn):
            if p.gpu_index in uuids:
                user = p.user or (f"uid {p.uid}" if p.uid is not None else "unknown")
                per_gpu = held.setdefault(p.gpu_index, {})
                per_gpu[user] = per_gpu.get(user, 0) + (p.used_mem_bytes or 0)
        fam = _family("gpuwatch_gpu_user_memory_bytes", "GPU memory held by a user's processes.", USER_LABELS)
        for index, users in sorted(held.items()):
            ranked = sorted(users.items(), key=lambda kv: (-kv[1], kv[0]))
            if len(ranked) > MAX_USERS_PER_GPU:
                keep = ranked[: MAX_USERS_PER_GPU - 1]
                ranked = keep + [(OTHERS, sum(b for _, b in ranked[len(keep) :]))]
            for user, used in ranked:
                fam.add_metric([str(index), uuids[index], self.hostname, user], used)
        return fam

    def _run_families(self, conn: Connection, newest_gpu_ms: int | None) -> list[Metric]:
        """Only running runs: finished ones would grow the series count without bound."""
        tps = _family(
            "gpuwatch_run_tokens_per_second", "Tokens per second of the run's last step.", RUN_LABELS
        )
        peak = _family("gpuwatch_run_peak_memory_bytes", "Peak CUDA memory of the run so far.", RUN_LABELS)
        step = _family("gpuwatch_run_step", "Last step the run reported.", RUN_LABELS)
        active: dict[str, tuple[list[str], int]] = {}
        for run in running_runs(conn):
            run_id = run.run_id
            labels = [
                run_id,
                run.name or "",
                run.user or "",
                run.job_id or run_id,
                "" if run.rank is None else str(run.rank),
                self.hostname,
            ]
            active[run_id] = labels, run.started_ms
            last = scrape.last_step(conn, run_id)
            if last is None:
                continue
            step.add_metric(labels, last.step)
            if last.tokens_per_s is not None:
                tps.add_metric(labels, last.tokens_per_s)
            peak_bytes = self._peak(conn, run_id)
            if peak_bytes is not None:
                peak.add_metric(labels, peak_bytes)
        for gone in set(self._peaks) - active.keys():
            del self._peaks[gone]
        counts = _family("gpuwatch_runs", "Runs in the database by status.", ("status",))
        for status, n in scrape.runs_by_status(conn).items():
            counts.add_metric([status], n)
        return [tps, peak, step, counts, self._energy_family(conn, active, newest_gpu_ms)]

    def _energy_family(
        self, conn: Connection, active: dict[str, tuple[list[str], int]], newest_gpu_ms: int | None
    ) -> Metric:
        """Joules of each running run's share of its GPUs (store/energy.py), folded from the
        samples stored since the last scrape up to the newest GPU sample."""
        from prometheus_client.core import CounterMetricFamily

        fam = CounterMetricFamily(
            "gpuwatch_run_energy_joules",
            "Energy of the run's share of its GPUs' time, from NVML's energy counter (J).",
            labels=list(RUN_LABELS),
        )
        if not active or newest_gpu_ms is None:
            return fam
        if self._energy is None and self._catch_up is None:
            since = min(started for _, started in active.values()) - PROCESS_TICK_SLACK_MS
            self._catch_up = threading.Thread(
                target=self._fold_history,
                args=(since, newest_gpu_ms + 1),
                name="gpuwatch-energy",
                daemon=True,
            )
            self._catch_up.start()
        ledger = self._energy
        if ledger is None:
            return fam  # still catching up: no partial figure that would later jump
        try:
            ledger.fold(conn, newest_gpu_ms + 1)
        except SQLiteError:
            self._energy = self._catch_up = None  # half folded: start again from the runs' starts
            raise
        for gone in set(ledger.joules) - active.keys():
            del ledger.joules[gone]
            ledger.gpus_of.pop(gone, None)
        for run_id, (labels, _) in active.items():
            if run_id in ledger.gpus_of:
                fam.add_metric(labels, ledger.joules[run_id])
        return fam

    def _fold_history(self, since_ms: int, until_ms: int) -> None:
        """Fold [since, until) into a fresh ledger on a connection of its own, a piece at a time;
        scrapes then fold only what came after."""
        ledger = EnergyLedger(since_ms)
        try:
            conn = open_ro(self.db_path)
        except StoreError:
            self._catch_up = None  # tried again on the next scrape
            return
        try:
            while ledger.until_ms < until_ms and not self._closing.is_set():
                ledger.fold(conn, min(until_ms, ledger.until_ms + ENERGY_CATCH_UP_MS))
        except SQLiteError:
            self._catch_up = None
            return
        finally:
            conn.close()
        self._energy = ledger

    def _peak(self, conn: Connection, run_id: str) -> int | None:
        seen, best = self._peaks.get(run_id, (-1, None))
        new = scrape.steps_after(conn, run_id, seen)
        if new.last_step is not None:
            if new.peak_bytes is not None and (best is None or new.peak_bytes > best):
                best = new.peak_bytes
            self._peaks[run_id] = (new.last_step, best)
        return best

    def _host_families(self, conn: Connection, newest_gpu_ms: int | None) -> list[Metric]:
        # The newest up to now: samples stamped before the wall clock stepped back are not.
        host = queries.latest_host_sample(conn)
        families = [self._last_sample(newest_gpu_ms, None if host is None else host.ts_ms)]
        families += _row_families(host, HOST_FIELDS, now_ms() - self.stale_after_ms)
        stats = queries.latest_daemon_stats(conn)
        families += _row_families(stats, DAEMON_FIELDS, now_ms() - self.stale_after_ms)
        size = _family("gpuwatch_database_size_bytes", "Database file plus its write-ahead log.", ())
        size.add_metric(
            [], sum(_file_size(self.db_path.with_name(self.db_path.name + suffix)) for suffix in ("", "-wal"))
        )
        families.append(size)
        return families

    def _alerts_family(self, conn: Connection) -> Metric:
        """gpuwatch_alerts_total{kind}: alerts written (one per incident), every kind present."""
        from prometheus_client.core import CounterMetricFamily

        from gpuwatch.alerts import KINDS

        counts = dict.fromkeys(KINDS, 0)
        counts.update(scrape.alerts_by_kind(conn))
        fam = CounterMetricFamily(
            "gpuwatch_alerts", "Alerts written, one per incident, by kind.", labels=["kind", "Hostname"]
        )
        for kind, n in counts.items():
            fam.add_metric([kind, self.hostname], n)
        return fam

    def _last_sample(self, newest_gpu_ms: int | None, host_ms: int | None) -> Metric:
        """When this host last stored a sample: with `up`, a fleet view says since when a host
        is unreachable or its daemon stopped sampling."""
        newest = max((t for t in (newest_gpu_ms, host_ms) if t is not None), default=None)
        fam = _family(
            "gpuwatch_host_last_sample_timestamp_seconds",
            "Time of the newest sample this host stored (seconds since the epoch).",
            ("Hostname",),
        )
        if newest is not None:
            fam.add_metric([self.hostname], newest / 1000)
        return fam

    def _extra_families(self) -> list[Metric]:
        if self.extra is None:
            return []
        families: list[Metric] = []
        for key, value in sorted(self.extra().items()):
            kind = "counter" if key.endswith("_total") else "gauge"
            fam = _family(f"gpuwatch_daemon_{key}", f"Daemon figure '{key}'.", (), kind)
            fam.add_metric([], float(value))
            families.append(fam)
        return families


def _add_mig_series(conn: Connection, families: list[Metric], labels_by_gpu: dict[int, list[str]]) -> None:
    """A series per GPU instance of each GPU in labels_by_gpu (the fresh ones) on MIG_FIELDS'
    families. The compute instances of one GPU instance share its memory: its first one's is
    taken, and utilisation only when there is one (most drivers give none on MIG anyway)."""
    instances: dict[tuple[int, int], list[queries.MigDevice]] = defaultdict(list)
    for d in queries.mig_devices(conn):
        if d.gpu_index in labels_by_gpu:
            instances[d.gpu_index, d.gpu_instance_id].append(d)
    by_name = {f.name: f for f in families}
    for (gpu, gi), devices in instances.items():
        labels = dict(zip(GPU_LABELS, labels_by_gpu[gpu]))
        labels.update(zip(MIG_LABELS, (_COMPUTE_SHARE.sub("", devices[0].profile or ""), str(gi))))
        for name, column, scale in MIG_FIELDS:
            value = getattr(devices[0], column)
            if value is not None and (column.endswith("bytes") or len(devices) == 1):
                by_name[name].add_sample(name, labels, value * scale)


def _prof_families(conn: Connection, labels_by_gpu: dict[int, list[str]], fresh_after: int) -> list[Metric]:
    """PROF_FIELDS' families: a series per fresh GPU with a recent GPM sample; none elsewhere
    (a GPU without GPM has no such series, as under dcgm-exporter)."""
    latest = queries.latest_gpu_prof_samples(conn, fresh_after)
    families: list[Metric] = []
    for name, column, doc in PROF_FIELDS:
        fam = _family(name, doc, GPU_LABELS)
        for gpu, sample in latest.items():
            value = getattr(sample, column)
            if gpu in labels_by_gpu and value is not None:
                fam.add_metric(labels_by_gpu[gpu], value / 100)
        families.append(fam)
    return families


def _row_families(
    row: queries.HostSample | queries.DaemonStats | None,
    fields: tuple[tuple[str, str, float, str], ...],
    min_ts_ms: int,
) -> list[Metric]:
    """A family for each of `fields` the row has a value of; none for a stale row."""
    if row is None or row.ts_ms < min_ts_ms:
        return []
    families: list[Metric] = []
    for name, column, scale, doc in fields:
        value = getattr(row, column)
        if value is not None:
            fam = _family(name, doc, ())
            fam.add_metric([], value * scale)
            families.append(fam)
    return families


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def parse_listen(listen: str) -> tuple[str, int]:
    """'host:port', '[v6]:port', ':port' or 'port' -> (host, port); loopback when no host is given."""
    text = listen.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or DEFAULT_HOST
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"metrics_listen: expected HOST:PORT such as 127.0.0.1:9400, got {listen!r}")
    return host, int(port_text)


@dataclass
class MetricsServer:
    host: str
    port: int  # the bound port (useful when asked for port 0)
    collector: StoreCollector
    _httpd: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
        self.collector.close()


def start_metrics_server(
    listen: str,
    db_path: str | os.PathLike[str],
    extra: Callable[[], Mapping[str, float]] | None = None,
    stale_after_s: float = 60.0,
    hostname: str | None = None,
) -> MetricsServer:
    """Serve /metrics on `listen` from a background thread; close() stops it. `hostname` is the
    Hostname label (default: this machine's name)."""
    from prometheus_client import CollectorRegistry, start_http_server

    host, port = parse_listen(listen)
    registry = CollectorRegistry(auto_describe=False)
    collector = StoreCollector(db_path, extra=extra, stale_after_s=stale_after_s, hostname=hostname)
    registry.register(collector)
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ConfigError(f"metrics_listen: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return MetricsServer(host, httpd.server_port, collector, httpd, thread)

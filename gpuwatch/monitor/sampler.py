"""The sampling loop: collector records in, rows out to the single writer.

Used by the daemon and by the client's embedded mode, so it knows nothing of signals or asyncio:
`start()` runs a Scheduler in a background thread, `stop()` stops it and flushes the writer.

Jobs: GPUs every cfg.interval, host every cfg.host_interval (one job when they are equal), the
run map every RUN_MAP_INTERVAL, store maintenance every MAINTENANCE_INTERVAL. Without an NVIDIA
driver it logs the reason once and samples the host only.

What is written, and how often (storage is most of what a monitor costs):
- gpu_samples and host_samples every tick.
- host_top_processes every cfg.process_interval: the cfg.top_processes busiest processes of the
  whole host by CPU % since the previous walk (on a GPU or not; TOP_PROCESS_MIN_CPU_PCT or more),
  from one walk of /proc that also gives the GPU processes' RSS and CPU %.
- gpu_process_samples every cfg.process_interval, and at once when the set of GPU processes
  changes (a process starts, leaves or changes kind), all GPUs at one ts_ms. The GPU processes
  are still sampled every GPU tick: sm/mem util written is the mean over the ticks since the
  previous write, used_mem_bytes the newest value; RSS and CPU % are re-read every
  cfg.process_interval (new pids at once). `kind` is NULL for 'compute', the usual case.
- mig_samples (MIG devices' newest memory and utilisation) with the process samples, and at
  once when the set of MIG devices changes; mig_devices rows when one is new, and once a minute.
- gpu_prof_samples (GPM: SM activity and occupancy, tensor and DRAM activity) every GPU tick,
  for the GPUs that have GPM (Hopper and later), over the interval since the previous tick.
- daemon_stats (the monitor's own cost) every DAEMON_STATS_INTERVAL_MS, CPU % over that window.

Every write is submitted without blocking: when the writer's queue is full the rows are
dropped and counted (writer.dropped_jobs) rather than stalling the sampling thread.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import operator
import os
import socket
import time
from functools import partial
from typing import TYPE_CHECKING, Callable, NamedTuple

import psutil

from collectors.host import HostCollector
from collectors.nvml import GpuProcessSample, MigStatic, NvmlCollector, NvmlUnavailable
from collectors.processes import ProcessCollector, ProcessInfo, Usage
from gpuwatch.alerts.rules import CHECK_INTERVAL_S, AlertRules
from gpuwatch.base.clock import SteadyWall
from gpuwatch.base.config import Config
from gpuwatch.monitor.scheduler import Scheduler
from gpuwatch.store import Writer, insert_rows, now_ms
from gpuwatch.store import samples as store_samples
from gpuwatch.store.running import running_runs
from gpuwatch.store.samples import TopProcess
from gpuwatch.store.writer import Job

if TYPE_CHECKING:
    import sqlite3

    from collectors.nvml import GpuTick

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL = 60.0
RUN_MAP_INTERVAL = 5.0
GPU_ROW_REFRESH_MS = 60_000  # gpus.last_seen_ms is refreshed this often, or when state changes
PROCESS_ROW_REFRESH_MS = 10_000  # processes.last_seen_ms likewise, or when its run link changes
DAEMON_STATS_INTERVAL_MS = 30_000
TOP_PROCESS_MIN_CPU_PCT = 1.0  # a process under 1 % of a core is nobody's slowdown
NVML_DEADLINE_SHARE = 0.5  # of the GPU interval: longer, and a GPU's reads are called hung
NVML_DEADLINE_MIN_S = 0.05  # but never less: a busy host's thread switches are not a hung GPU


class _GpuRow(NamedTuple):
    """What a GPU's `gpus` row says, as last written."""

    state: str
    written_ms: int
    since_ms: int  # when it entered that state


class _KnownPid(NamedTuple):
    """A GPU process as its `processes` row was last written (the alert rules read info and
    run_id of it too)."""

    info: ProcessInfo
    run_id: str | None
    written_ms: int


class _MigRows(NamedTuple):
    """The MIG devices last upserted, and when."""

    static: list[MigStatic]
    written_ms: int


class _CpuMark(NamedTuple):
    at: float  # monotonic s
    cpu_s: float  # our own CPU time then


class _MeanUtil(NamedTuple):
    sm_pct: int | None
    mem_pct: int | None


_NO_UTIL = _MeanUtil(None, None)


class Sampler:
    def __init__(
        self,
        writer: Writer,
        config: Config,
        nvml_module=None,
        dropped_events: Callable[[], int] | None = None,
        clock: Callable[[], int] = now_ms,
        monotonic: Callable[[], float] = time.monotonic,
        alert_stalls: bool = True,
    ):
        """`nvml_module`: a pynvml-like module (tests pass fake_pynvml); default the real one.

        `dropped_events`: how many events were dropped so far, for daemon_stats (default: the
        writer's jobs refused because its queue was full, samples included).

        `clock`: ms since the epoch, for every ts_ms written and for the write cadences above
        (tests and the storage bench inject one to tick through hours in seconds);
        `monotonic`: seconds, which retention's idea of now may not run ahead of (clock.py).

        The alert rules (gpuwatch/alerts/rules.py) run with the sampler; `alert_stalls`: they
        also raise run.stalled (False in the daemon, whose stall watch does, with the stacks).
        """
        self.writer = writer
        self.cfg = config
        self.clock = clock
        self.retention_clock = SteadyWall(clock, monotonic)
        self.dropped_events = dropped_events or (lambda: writer.dropped_jobs)
        self.host_name = socket.gethostname()
        self.rules = AlertRules(config, self.host_name, clock, detect_stalls=alert_stalls)
        self.nvml: NvmlCollector | None = None
        self.nvml_error = ""
        try:
            # A GPU's reads may take half an interval; the rest of the tick stays the others'.
            self.nvml = NvmlCollector(
                nvml=nvml_module, deadline_s=max(NVML_DEADLINE_SHARE * config.interval, NVML_DEADLINE_MIN_S)
            )
        except NvmlUnavailable as e:
            self.nvml_error = str(e) or "NVML unavailable"
            log.warning("no GPUs to sample, host only: %s", self.nvml_error)
        self.host = HostCollector()
        self.procs = ProcessCollector()
        self._cpu_mark = _CpuMark(time.monotonic(), _own_cpu_s())
        self._gpu_rows: dict[int, _GpuRow] = {}  # by gpu_index
        self._run_by_pid: dict[int, str] = {}  # pid of a running run on this host -> run_id
        self._lineage: dict[tuple[int, int], tuple[int, ...]] = {}  # (pid, start_ms) -> pid + ancestors
        # GPU pids of the previous tick -> (info, run_id written, when written). A pid still on
        # a GPU one tick later is taken to be the same process, so its facts are not re-read.
        self._gpu_pids: dict[int, _KnownPid] = {}
        self._runs_checked: dict | None = None  # the run map _gpu_pids was last checked against
        self._gpu_pids_checked_ms = self._gpu_pids_next_ms = 0
        # RSS and CPU % of every host process, from one walk of /proc every
        # cfg.process_interval (each tick would be most of the daemon's CPU): the GPU pids'
        # are taken from it (new GPU pids are read at once), the busiest go to host_top_processes.
        self._host_usage: dict[int, Usage] = {}
        self._walk_ms: int | None = None  # when the latest walk was
        self._usage: dict[int, Usage] = {}  # the GPU pids'
        self._usage_walk_ms: int | None = None  # the walk _usage was taken from
        self._top_walk_ms: int | None = None  # the walk whose top processes were written
        # Each tick's process samples since the last gpu_process_samples write (util is
        # written as the mean over them), and the (gpu, pid, kind) list that write held.
        self._proc_window: list[list] = []
        self._proc_keys: list[tuple] = []
        self._mig_keys: list[tuple] = []  # the MIG devices the last process write covered
        self._mig_rows: _MigRows | None = None
        self._proc_written_ms: int | None = None
        self._stats_written_ms: int | None = None
        self.dropped_samples = 0  # ticks whose samples the database could not take
        self.last_tick_s = 0.0  # seconds the latest GPU (or host) tick took
        self.last_tick_at = 0.0  # monotonic time it finished; 0 = none yet
        self.sched = Scheduler()
        if self.nvml is not None and config.host_interval == config.interval:
            # One job for both: one writer transaction a tick instead of two (~0.2 ms each).
            self.sched.add("gpu+host", config.interval, self.tick)
        else:
            if self.nvml is not None:
                self.sched.add("gpu", config.interval, self.gpu_tick)
            self.sched.add("host", config.host_interval, self.host_tick)
        self.sched.add("runs", RUN_MAP_INTERVAL, self.refresh_runs)
        self.sched.add("alerts", CHECK_INTERVAL_S, self.check_alerts)
        self.sched.add(
            "maintenance", MAINTENANCE_INTERVAL, self.maintenance_tick, first_delay=MAINTENANCE_INTERVAL
        )

    @property
    def gpu_available(self) -> bool:
        return self.nvml is not None

    @property
    def gpu_count(self) -> int:
        return len(self.nvml.static) if self.nvml is not None else 0

    def start(self) -> None:
        self.sched.start("gpuwatch-sampler")

    def stop(self, flush_timeout: float = 10.0) -> None:
        self.sched.stop()
        self.check_alerts()  # a run that ended just now (the wrapper's own) gets its alert
        self.writer.flush(flush_timeout)
        self.host.close()
        self.procs.close()
        if self.nvml is not None:
            self.nvml.close()

    def healthy(self) -> bool:
        """True while ticks keep coming: the watchdog is fed only then."""
        if not self.sched.alive():
            return False
        if not self.last_tick_at:
            return True  # just started
        # last_tick_at comes from the GPU tick (the host tick when host-only). A hung GPU does
        # not stop it (its NVML calls are abandoned at a deadline, see collectors/nvml.py), so
        # only the sampler's own trouble starves the watchdog: never a restart loop over a GPU.
        period = self.cfg.interval if self.nvml else self.cfg.host_interval
        return time.monotonic() - self.last_tick_at < max(3 * period, 10.0)

    def status_line(self) -> str:
        if self.nvml is None:
            return f"host only: {self.nvml_error}"
        return f"sampling {self.gpu_count} GPUs every {self.cfg.interval:g}s"

    # --- ticks (scheduler thread) ---

    # Each tick hands the writer ONE job holding all its rows: one wake-up of the writer
    # thread and one savepoint per tick instead of one per table.

    def tick(self) -> None:
        """GPUs and host together, when they share an interval."""
        started = time.monotonic()
        ts = self.clock()
        self._tick_done(ts, started, self._gpu_writes(ts) + self._host_writes(ts))

    def gpu_tick(self) -> None:
        started = time.monotonic()
        ts = self.clock()
        self._tick_done(ts, started, self._gpu_writes(ts))

    def host_tick(self) -> None:
        started = time.monotonic()
        ts = self.clock()
        if self.nvml is None:
            self._tick_done(ts, started, self._host_writes(ts))
        else:
            self._submit(self._host_writes(ts))

    def _gpu_writes(self, ts: int) -> list[Job]:
        tick = self.nvml.sample_tick(ts)
        writes: list[Job] = []
        if tick.prof:
            writes.append(partial(store_samples.insert_records, table="gpu_prof_samples", records=tick.prof))
        self._write_gpus(ts, tick, writes)
        if tick.samples:
            writes.append(
                partial(
                    store_samples.insert_records,
                    table="gpu_samples",
                    records=tick.samples,
                    keep_on_clash=True,
                )
            )
        self._write_mig_devices(ts, writes)
        self._write_process_samples(ts, tick, writes)
        self._write_processes(ts, {p.pid for p in tick.processes}, writes)
        if tick.xids:
            writes.append(partial(store_samples.insert_records, table="xid_events", records=tick.xids))
        writes.append(
            self.rules.gpu_job(ts, self.nvml.static, tick.samples, tick.processes, self._gpu_pids, tick.xids)
        )
        return writes

    def _host_writes(self, ts: int) -> list[Job]:
        writes: list[Job] = [
            partial(
                store_samples.insert_records,
                table="host_samples",
                records=[self.host.sample(ts)],
                keep_on_clash=True,
            )
        ]
        if self.cfg.top_processes <= 0:
            return writes
        self._walk(ts)
        if self._top_walk_ms != self._walk_ms:
            self._top_walk_ms = self._walk_ms
            rows = self._top_processes(self._walk_ms)
            if rows:
                writes.append(partial(store_samples.insert_top_processes, rows=rows))
        return writes

    def _walk(self, ts: int, gpu_pids: set[int] | None = None) -> None:
        """Every host process's RSS and CPU %, read once per cfg.process_interval (only the
        GPU processes' when no top processes are kept). The GPU processes (these, or the
        previous tick's) are read in full: their RSS is stored even while they sleep."""
        if _due(ts, self._walk_ms, int(self.cfg.process_interval * 1000)):
            pids = self._gpu_pids.keys() if gpu_pids is None else gpu_pids
            self._host_usage = self.procs.walk(pids) if self.cfg.top_processes > 0 else self.procs.usage(pids)
            self._walk_ms = ts

    def _top_processes(self, ts: int) -> list[TopProcess]:
        """host_top_processes rows: the busiest processes of the latest walk, who and how busy."""
        busiest = heapq.nlargest(
            self.cfg.top_processes,
            (
                (usage.cpu_pct, pid)
                for pid, usage in self._host_usage.items()
                if usage.cpu_pct and usage.cpu_pct >= TOP_PROCESS_MIN_CPU_PCT
            ),
        )
        rows = []
        for cpu, pid in busiest:
            info = self.procs.walked_info(pid)
            if info is not None:  # else gone since, or a zombie
                rows.append(
                    TopProcess(
                        ts,
                        pid,
                        info.start_ms,
                        info.uid,
                        info.user,
                        info.cmdline,
                        cpu,
                        self._host_usage[pid].rss_bytes,
                    )
                )
        return rows

    def stats_row(self, ts: int) -> dict:
        """The monitor's own cost since the previous call, for daemon_stats."""
        now = time.monotonic()
        cpu = _own_cpu_s()
        then = self._cpu_mark
        self._cpu_mark = _CpuMark(now, cpu)
        row = {
            "ts_ms": ts,
            "cpu_pct": round(100.0 * (cpu - then.cpu_s) / max(now - then.at, 1e-6), 3),
            "rss_bytes": _own_rss_bytes(),
            "tick_ms": round(self.last_tick_s * 1000.0, 3),
            "queue_depth": self.writer.depth(),
            "dropped_events": self.dropped_events(),
            "db_bytes": _db_bytes(self.writer.path),
        }
        return row

    def refresh_runs(self) -> None:
        """Reload which pids are running runs on this host (read inside the writer thread)."""
        host = self.host_name

        def read(conn: sqlite3.Connection) -> None:
            self._run_by_pid = {r.pid: r.run_id for r in running_runs(conn, host) if r.pid is not None}

        self.writer.submit(read, block=False)

    def check_alerts(self) -> None:
        """The alert rules' look at runs, disk and wishes, in the writer thread."""
        self.writer.submit(self.rules.check, self._rules_written, block=False)

    def _rules_written(self, ok: bool) -> None:
        if not ok:
            self.rules.forget()

    def maintenance_tick(self) -> None:
        """Store rollups/retention/size cap (in the writer thread), and forget exited processes."""
        from gpuwatch.store.maintenance import maintain

        self.procs.forget_gone()
        self._lineage = {k: v for k, v in self._lineage.items() if psutil.pid_exists(k[0])}
        cfg = self.cfg
        hour, day = 3_600_000, 86_400_000
        now, steady = self.clock(), self.retention_clock()
        self.writer.submit(
            lambda conn: maintain(
                conn,
                now,
                retention_now_ms=steady,
                raw_retention_ms=int(cfg.raw_retention_hours * hour),
                minute_retention_ms=int(cfg.minute_retention_days * day),
                hour_retention_ms=int(cfg.hour_retention_days * day),
                max_db_bytes=int(cfg.max_db_mb * 1024 * 1024),
            ),
            block=False,
        )

    # --- helpers ---

    def _submit(self, writes: list[Job]) -> None:
        def job(conn: sqlite3.Connection) -> None:
            for write in writes:
                write(conn)

        self.writer.submit(job, self._written, block=False)

    def _written(self, ok: bool) -> None:
        if not ok:  # the database could not take it (disk full): this tick's samples are lost
            self.dropped_samples += 1
            self.rules.forget()  # and the alert rules' episodes it began or fired

    def _tick_done(self, ts: int, started: float, writes: list[Job]) -> None:
        """Record the tick's duration, add a daemon_stats row when due, submit the tick's writes."""
        self.last_tick_at = time.monotonic()
        self.last_tick_s = self.last_tick_at - started
        if _due(ts, self._stats_written_ms, DAEMON_STATS_INTERVAL_MS):
            self._stats_written_ms = ts
            row = self.stats_row(ts)
            writes.append(lambda conn: insert_rows(conn, "daemon_stats", [row], "REPLACE"))
        self._submit(writes)

    def _write_gpus(self, ts: int, tick: GpuTick, writes: list[Job]) -> None:
        """Upsert `gpus` rows when a GPU is new or its state changed, and once a minute."""
        state_by_index = {s.gpu_index: (s.state or "ok") for s in tick.samples}
        rows = []
        for static in self.nvml.static:
            state = state_by_index.get(static.gpu_index)
            if state is None:  # late this tick (our process was busy): its row stays as it was
                continue
            last = self._gpu_rows.get(static.gpu_index)
            if last is not None and last.state == state and ts - last.written_ms < GPU_ROW_REFRESH_MS:
                continue
            since = last.since_ms if last is not None and last.state == state else ts
            self._gpu_rows[static.gpu_index] = _GpuRow(state, ts, since)
            rows.append(
                {
                    **_row(static),
                    "first_seen_ms": ts,
                    "last_seen_ms": ts,
                    "state": state,
                    "state_since_ms": since,
                }
            )
        if rows:
            writes.append(partial(store_samples.upsert_gpus, rows=rows))

    def _write_mig_devices(self, ts: int, writes: list[Job]) -> None:
        """Upsert `mig_devices` rows when the MIG devices changed, and once a minute."""
        static = self.nvml.mig_static
        if not static or (
            self._mig_rows is not None
            and self._mig_rows.static == static
            and not _due(ts, self._mig_rows.written_ms, GPU_ROW_REFRESH_MS)
        ):
            return
        self._mig_rows = _MigRows(static, ts)
        rows = [{**_row(m), "first_seen_ms": ts, "last_seen_ms": ts} for m in static]
        writes.append(partial(store_samples.upsert_mig_devices, rows=rows))

    def _write_process_samples(self, ts: int, tick: GpuTick, writes: list[Job]) -> None:
        """Keep this tick's samples; write the window when due or when the set changed."""
        proc_samples, mig_samples = tick.processes, tick.migs
        self._proc_window.append(proc_samples)
        keys = list(map(_PROCESS_KEY, proc_samples))  # sorted by GPU, then pid, by the collector
        mig_keys = list(map(_MIG_KEY, mig_samples))
        interval_ms = int(self.cfg.process_interval * 1000)
        if (
            keys == self._proc_keys
            and mig_keys == self._mig_keys
            and not _due(ts, self._proc_written_ms, interval_ms)
        ):
            return
        self._proc_keys, self._mig_keys, self._proc_written_ms = keys, mig_keys, ts
        if mig_samples:
            writes.append(partial(store_samples.insert_records, table="mig_samples", records=mig_samples))
        util = _mean_util(self._proc_window)
        self._proc_window = []
        usage = self._process_usage(ts, {p.pid for p in proc_samples})
        rows = []
        for p in proc_samples:
            used, mean = usage.get(p.pid), util.get((p.gpu_index, p.pid), _NO_UTIL)
            rows.append(
                GpuProcessSample(
                    p.gpu_index,
                    p.pid,
                    ts,
                    p.kind,
                    p.used_mem_bytes,
                    mean.sm_pct,
                    mean.mem_pct,
                    used.rss_bytes if used else None,
                    used.cpu_pct if used else None,
                    p.gpu_instance_id,
                    p.compute_instance_id,
                )
            )
        if rows:
            writes.append(partial(store_samples.insert_process_samples, ts_ms=ts, samples=rows))

    def _write_processes(self, ts: int, pids: set[int], writes: list[Job]) -> None:
        """Upsert `processes` rows for GPU pids: new ones, changed run links, and every so often."""
        if (
            pids == self._gpu_pids.keys()
            and self._run_by_pid is self._runs_checked
            and self._gpu_pids_checked_ms <= ts < self._gpu_pids_next_ms
        ):
            return  # same pids, same run map, no row due for its refresh: nothing to write
        rows = []
        current = {}
        for pid in sorted(pids):
            known = self._gpu_pids.get(pid)
            info = known.info if known else self.procs.info(pid)
            if info is None:  # gone already, or in another pid namespace
                continue
            run_id = self._run_of(pid, info.start_ms)
            if known and known.run_id == run_id and not _due(ts, known.written_ms, PROCESS_ROW_REFRESH_MS):
                current[pid] = known
                continue
            current[pid] = _KnownPid(info, run_id, ts)
            rows.append({**_row(info), "run_id": run_id, "first_seen_ms": ts, "last_seen_ms": ts})
        self._gpu_pids = current
        self._runs_checked, self._gpu_pids_checked_ms = self._run_by_pid, ts
        self._gpu_pids_next_ms = (
            min((k.written_ms for k in current.values()), default=ts) + PROCESS_ROW_REFRESH_MS
        )
        if rows:
            writes.append(partial(store_samples.upsert_processes, rows=rows))

    def _process_usage(self, ts: int, pids: set[int]) -> dict[int, Usage]:
        self._walk(ts, pids)
        if self._usage_walk_ms != self._walk_ms:  # a walk since: the GPU pids' figures from it
            self._usage_walk_ms = self._walk_ms
            self._usage = {pid: self._host_usage[pid] for pid in pids if pid in self._host_usage}
            missing = pids - self._usage.keys()  # started since the walk began
            if missing:
                self._usage.update(self.procs.usage(missing))
        else:
            new = pids - self._usage.keys()
            if new:
                self._usage.update(self.procs.usage(new))
        return self._usage

    def _run_of(self, pid: int, start_ms: int) -> str | None:
        """The running run this pid belongs to: itself or its nearest ancestor that is a run's pid."""
        if not self._run_by_pid:
            return None
        key = (pid, start_ms)
        lineage = self._lineage.get(key)
        if lineage is None:
            lineage = (pid,) + _ancestors(pid)
            self._lineage[key] = lineage
        for candidate in lineage:
            run_id = self._run_by_pid.get(candidate)
            if run_id is not None:
                return run_id
        return None


_COLUMNS: dict[type, tuple[tuple[str, ...], Callable]] = {}


_PROCESS_KEY = operator.attrgetter("gpu_index", "pid", "kind")
_MIG_KEY = operator.attrgetter("gpu_index", "gpu_instance_id", "compute_instance_id")


def _mean_util(ticks: list[list[GpuProcessSample]]) -> dict[tuple[int, int], _MeanUtil]:
    """(gpu, pid) -> mean sm and mem util % over the ticks' samples that had a value."""
    sums: dict[tuple[int, int], list[int]] = {}
    for samples in ticks:
        for p in samples:
            acc = sums.get((p.gpu_index, p.pid))
            if acc is None:
                acc = sums[(p.gpu_index, p.pid)] = [0, 0, 0, 0]
            if p.sm_util_pct is not None:
                acc[0] += p.sm_util_pct
                acc[1] += 1
            if p.mem_util_pct is not None:
                acc[2] += p.mem_util_pct
                acc[3] += 1
    return {
        key: _MeanUtil(round(sm / sm_n) if sm_n else None, round(mem / mem_n) if mem_n else None)
        for key, (sm, sm_n, mem, mem_n) in sums.items()
    }


def _due(ts: int, last: int | None, interval_ms: int) -> bool:
    """True when interval_ms passed since `last` (or never, or the wall clock stepped back)."""
    return last is None or not 0 <= ts - last < interval_ms


def _columns(record) -> tuple[tuple[str, ...], Callable]:
    """A collector record type's field names, and a getter returning its values as a tuple."""
    found = _COLUMNS.get(type(record))
    if found is None:
        names = tuple(f.name for f in dataclasses.fields(record))
        found = _COLUMNS[type(record)] = (names, operator.attrgetter(*names))
    return found


def _row(record) -> dict:
    """A collector record as a dict row."""
    names, values_of = _columns(record)
    return dict(zip(names, values_of(record)))


def _own_cpu_s() -> float:
    t = os.times()  # a syscall; psutil parses /proc/self/stat, a visible share of an idle tick
    return t.user + t.system


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _own_rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def _ancestors(pid: int) -> tuple[int, ...]:
    try:
        return tuple(p.pid for p in psutil.Process(pid).parents())
    except (psutil.Error, OSError):
        return ()


def _db_bytes(path) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += os.stat(f"{path}{suffix}").st_size
        except OSError:
            pass
    return total

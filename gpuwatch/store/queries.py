"""Read queries returning frozen dataclasses: what the TUI, CLI, /metrics and reports call.

Every function takes an open connection (usually from `open_ro`) and never writes.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, TypeVar

from gpuwatch.base.clock import STEP_TOLERANCE_MS
from gpuwatch.store.db import StoreError, now_ms
from gpuwatch.store.schema import GPU_METRICS, HOST_METRICS, QUARTER_HOUR_MS
from gpuwatch.store.search import MATCHES, match_expression

HOUR_MS = 3_600_000
# Series tiers: raw only for ranges up to RAW_MAX_RANGE_MS (6 h of one GPU is 21,600 rows),
# 15-minute periods up to QUARTER_HOUR_MAX_RANGE_MS.
RAW_MAX_RANGE_MS = 6 * HOUR_MS
QUARTER_HOUR_MAX_RANGE_MS = 2 * 24 * HOUR_MS
# The newest process tick counts as current unless GPU samples are this much newer: the sampler
# writes process samples every process_interval (5 s by default) or when the set changes.
PROCESS_TICK_SLACK_MS = 12_000


@dataclass(frozen=True)
class GpuInfo:
    gpu_index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    mem_total_bytes: int | None
    power_limit_mw: int | None
    mig_mode: int | None
    driver_version: str | None
    cuda_driver_version: str | None
    first_seen_ms: int
    last_seen_ms: int
    state: str  # ok | lost | hung (its NVML calls block: "not responding")
    state_since_ms: int | None  # when it entered that state


@dataclass(frozen=True)
class GpuProfSample:
    """GPM figures of one GPU over one tick (Hopper and later), each 0-100 or None."""

    gpu_index: int
    ts_ms: int
    sm_active_pct: float | None
    sm_occupancy_pct: float | None
    tensor_active_pct: float | None
    dram_active_pct: float | None


@dataclass(frozen=True)
class GpuSample:
    gpu_index: int
    ts_ms: int
    gpu_util_pct: int | None
    mem_util_pct: int | None
    mem_used_bytes: int | None
    mem_free_bytes: int | None
    mem_reserved_bytes: int | None
    temp_c: int | None
    power_mw: int | None
    energy_mj: int | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    pcie_tx_kbps: int | None
    pcie_rx_kbps: int | None
    fan_pct: int | None
    pstate: int | None
    throttle_reasons: int | None
    ecc_corrected: int | None
    ecc_uncorrected: int | None
    state: str | None


@dataclass(frozen=True)
class HostSample:
    ts_ms: int
    cpu_pct: float | None
    load1: float | None
    load5: float | None
    load15: float | None
    mem_total_bytes: int | None
    mem_used_bytes: int | None
    mem_available_bytes: int | None
    swap_used_bytes: int | None
    disk_read_bytes: int | None
    disk_write_bytes: int | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None
    shm_total_bytes: int | None
    shm_used_bytes: int | None
    swap_in_bytes: int | None  # cumulative counters
    swap_out_bytes: int | None
    page_cache_bytes: int | None


@dataclass(frozen=True)
class GpuProcess:
    gpu_index: int
    pid: int
    ts_ms: int
    kind: str | None
    used_mem_bytes: int | None
    sm_util_pct: int | None
    mem_util_pct: int | None
    rss_bytes: int | None
    cpu_pct: float | None
    uid: int | None
    user: str | None
    cmdline: str | None
    run_id: str | None
    run_name: str | None
    gpu_instance_id: int | None = None  # the MIG device it runs on; None off MIG
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class MigDevice:
    """A MIG device now (in the newest MIG tick), with that tick's figures."""

    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    name: str | None
    profile: str | None
    mem_total_bytes: int | None
    sm_count: int | None
    ts_ms: int
    mem_used_bytes: int | None
    mem_free_bytes: int | None
    gpu_util_pct: int | None  # None: NVML gives none for this MIG device
    mem_util_pct: int | None


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    job_id: str | None
    name: str | None
    user: str | None
    uid: int
    pid: int | None
    host: str | None
    status: str
    started_ms: int
    ended_ms: int | None
    last_step_ms: int | None
    steps: int
    tokens_per_s_avg: float | None
    tokens_per_s_last: float | None
    peak_mem_bytes: int | None
    oom: bool
    rank: int | None
    world_size: int | None


@dataclass(frozen=True)
class Run:
    run_id: str
    job_id: str | None
    name: str | None
    uid: int
    user: str | None
    pid: int | None
    host: str | None
    status: str
    exit_code: int | None
    signal: int | None
    error_type: str | None
    error_message: str | None
    started_ms: int
    ended_ms: int | None
    last_step_ms: int | None
    command: str | None
    cwd: str | None
    git_commit: str | None
    config_json: str | None
    torch_version: str | None
    cuda_version: str | None
    gpu_uuids: str | None
    rank: int | None
    local_rank: int | None
    world_size: int | None
    slurm_job_id: str | None
    parent_run_id: str | None
    flops_per_token: float | None
    mode: str | None
    id: int  # a stable integer key, which the search index refers to (store/search.py)
    config: dict[str, Any] = field(default_factory=dict)  # config_json parsed; {} when absent or not JSON


@dataclass(frozen=True)
class StepRow:
    run_id: str
    step: int
    ts_ms: int
    tokens: int | None
    samples: int | None
    seq_len: int | None
    loss: float | None
    step_time_ms: float | None
    tokens_per_s: float | None
    mfu: float | None
    mem_allocated_bytes: int | None
    mem_reserved_bytes: int | None
    mem_peak_bytes: int | None
    rss_bytes: int | None
    data_wait_pct: float | None  # share of the step before its compute began (data loading)
    n_steps: int  # steps this row stands for (folded rows: more than one)
    losses_json: str | None  # per-optimiser losses, a JSON object
    step_time_min_ms: float | None  # a folded row's fastest and slowest step
    step_time_max_ms: float | None
    compute_pct: float | None  # share from the first training forward to the step's end
    eval_pct: float | None  # share in evaluation forwards and checkpoint saves before it
    closure_evals: int | None  # a closure optimiser's evaluations of its closure


@dataclass(frozen=True)
class SeriesPoint:
    ts_ms: int  # start of the bucket
    min: float | None
    avg: float | None
    max: float | None


@dataclass(frozen=True)
class SlotUtil:
    gpu_index: int
    slot_ms: int  # start of the slot, a multiple of its width
    util_pct: float  # mean utilisation of the samples in the slot
    newest_ms: int  # the newest sample in it


T = TypeVar("T")


def columns_of(cls: type, prefix: str = "") -> str:
    """The SELECT list for a dataclass whose fields are column names."""
    return ", ".join(prefix + f.name for f in fields(cls) if f.name != "config")


def _build(cls: type[T], rows: Iterable[tuple[Any, ...]]) -> list[T]:
    return [cls(*row) for row in rows]


def distinct_keys(table: str, col: str) -> str:
    """A CTE `keys(k)` listing distinct leading-key values by seeking the primary key,
    instead of scanning every sample."""
    return (
        f"WITH RECURSIVE keys(k) AS (SELECT min({col}) FROM {table} UNION ALL "
        f"SELECT (SELECT min({col}) FROM {table} WHERE {col} > keys.k) FROM keys "
        f"WHERE keys.k IS NOT NULL) "
    )


def every_gpu(table: str) -> str:
    """Operand for `gpu_index IN ...`: the table's GPUs, found by seeking its primary key. With
    it a ts_ms range over every GPU seeks (gpu_index, ts_ms) once per GPU instead of reading
    every sample of the table."""
    return f"({distinct_keys(table, 'gpu_index')}SELECT k FROM keys WHERE k IS NOT NULL)"


# --- GPUs and host ---------------------------------------------------------------------------


def gpus(conn: sqlite3.Connection) -> list[GpuInfo]:
    return _build(GpuInfo, conn.execute(f"SELECT {columns_of(GpuInfo)} FROM gpus ORDER BY gpu_index"))


def _upto(now: int | None) -> dict[str, int]:
    """The newest sample time a reader at `now` (default: the wall clock) takes as current. Samples
    stamped later were written before the wall clock stepped back: until it is past them again
    the newest samples are the ones written since, so a view of "now" recovers at once."""
    return {"upto": (now_ms() if now is None else now) + STEP_TOLERANCE_MS}


def latest_gpu_samples(conn: sqlite3.Connection, now: int | None = None) -> dict[int, GpuSample]:
    """The newest sample of each GPU, one primary-key seek per GPU."""
    rows = conn.execute(
        distinct_keys("gpu_samples", "gpu_index")
        + f"SELECT {columns_of(GpuSample, 's.')} FROM keys JOIN gpu_samples s "
        "ON s.gpu_index = keys.k AND s.ts_ms = "
        "(SELECT max(ts_ms) FROM gpu_samples WHERE gpu_index = keys.k AND ts_ms <= :upto) "
        "ORDER BY s.gpu_index",
        _upto(now),
    )
    return {sample.gpu_index: sample for sample in _build(GpuSample, rows)}


def latest_gpu_prof_samples(
    conn: sqlite3.Connection, since_ms: int, now: int | None = None
) -> dict[int, GpuProfSample]:
    """The newest GPM sample (at or before `now`, as latest_gpu_samples) of each GPU that has
    one at or after since_ms (older ones describe a GPU that no longer gives GPM figures): a
    primary-key seek per GPU."""
    rows = conn.execute(
        distinct_keys("gpu_prof_samples", "gpu_index")
        + f"SELECT {columns_of(GpuProfSample, 's.')} FROM keys JOIN gpu_prof_samples s "
        "ON s.gpu_index = keys.k AND s.ts_ms = "
        "(SELECT max(ts_ms) FROM gpu_prof_samples WHERE gpu_index = keys.k AND ts_ms <= :upto) "
        "WHERE s.ts_ms >= :since ORDER BY s.gpu_index",
        dict(_upto(now), since=since_ms),
    )
    return {sample.gpu_index: sample for sample in _build(GpuProfSample, rows)}


def latest_host_sample(conn: sqlite3.Connection, now: int | None = None) -> HostSample | None:
    row = conn.execute(
        f"SELECT {columns_of(HostSample)} FROM host_samples WHERE ts_ms <= :upto ORDER BY ts_ms DESC LIMIT 1",
        _upto(now),
    ).fetchone()
    return HostSample(*row) if row else None


@dataclass(frozen=True)
class DaemonStats:
    """The monitor's own cost (a daemon_stats row)."""

    ts_ms: int
    cpu_pct: float | None
    rss_bytes: int | None
    tick_ms: float | None
    queue_depth: int | None
    dropped_events: int | None
    db_bytes: int | None


def latest_daemon_stats(conn: sqlite3.Connection, now: int | None = None) -> DaemonStats | None:
    row = conn.execute(
        f"SELECT {columns_of(DaemonStats)} FROM daemon_stats WHERE ts_ms <= :upto ORDER BY ts_ms DESC LIMIT 1",
        _upto(now),
    ).fetchone()
    return DaemonStats(*row) if row else None


def gpu_series(
    conn: sqlite3.Connection,
    gpu_index: int,
    metric: str,
    since_ms: int,
    until_ms: int | None = None,
    max_points: int = 240,
) -> list[SeriesPoint]:
    """min/avg/max of one GPU metric in at most max_points buckets over [since_ms, until_ms)."""
    if metric not in GPU_METRICS:
        raise StoreError(f"unknown GPU metric '{metric}'; known: {', '.join(GPU_METRICS)}")
    return _series(conn, "gpu_samples", ("gpu_index", gpu_index), metric, since_ms, until_ms, max_points)


def host_series(
    conn: sqlite3.Connection, metric: str, since_ms: int, until_ms: int | None = None, max_points: int = 240
) -> list[SeriesPoint]:
    """min/avg/max of one host metric in at most max_points buckets over [since_ms, until_ms)."""
    if metric not in HOST_METRICS:
        raise StoreError(f"unknown host metric '{metric}'; known: {', '.join(HOST_METRICS)}")
    return _series(conn, "host_samples", None, metric, since_ms, until_ms, max_points)


def series_tier(
    conn: sqlite3.Connection, table: str, key: tuple[str, int] | None, since_ms: int, until_ms: int
) -> tuple[str, int]:
    """(table, period_ms) to read a range from: the finest tier the range length allows whose
    data reaches back to since_ms (older raw data is deleted once rolled up); when none does
    (a young database), the finest allowed tier."""
    span = until_ms - since_ms
    tiers = [(table, 0), (f"{table}_15m", QUARTER_HOUR_MS), (f"{table}_1h", HOUR_MS)]
    if span > QUARTER_HOUR_MAX_RANGE_MS:
        tiers = tiers[2:]
    elif span > RAW_MAX_RANGE_MS:
        tiers = tiers[1:]
    where, params = (f"WHERE {key[0]} = ?", (key[1],)) if key else ("", ())
    for name, period in tiers:
        oldest = conn.execute(f"SELECT min(ts_ms) FROM {name} {where}", params).fetchone()[0]
        if oldest is not None and oldest <= since_ms:
            return name, period
    return tiers[0]


def _series(
    conn: sqlite3.Connection,
    table: str,
    key: tuple[str, int] | None,
    metric: str,
    since_ms: int,
    until_ms: int | None,
    max_points: int,
) -> list[SeriesPoint]:
    until_ms = now_ms() if until_ms is None else until_ms
    if until_ms <= since_ms or max_points < 1:
        return []
    tier, period = series_tier(conn, table, key, since_ms, until_ms)
    width = max(-(-(until_ms - since_ms) // max_points), period, 1)
    if period:  # a rollup tier: weight each period's average by its sample count
        values = (
            f"min({metric}_min), sum({metric}_avg * n) / "
            f"sum(CASE WHEN {metric}_avg IS NOT NULL THEN n END), max({metric}_max)"
        )
        present = f"{metric}_avg IS NOT NULL"
    else:
        values = f"min({metric}), avg({metric}), max({metric})"
        present = f"{metric} IS NOT NULL"
    where = f"{key[0]} = ? AND " if key else ""
    params = (since_ms, width) + ((key[1],) if key else ()) + (since_ms, until_ms)
    rows = conn.execute(
        f"SELECT (ts_ms - ?) / ? AS bucket, {values} FROM {tier} "
        f"WHERE {where}ts_ms >= ? AND ts_ms < ? AND {present} GROUP BY bucket ORDER BY bucket",
        params,
    )
    return [SeriesPoint(since_ms + bucket * width, lo, avg, hi) for bucket, lo, avg, hi in rows]


def util_by_slot(
    conn: sqlite3.Connection, gpu_indexes: list[int], since_ms: int, until_ms: int, slot_ms: int
) -> list[SlotUtil]:
    """Each GPU's mean utilisation per clock-aligned slot of `slot_ms` in [since_ms, until_ms)
    (the TUI's sparklines); slots with no utilisation sampled are absent."""
    if not gpu_indexes:
        return []
    marks = ",".join("?" * len(gpu_indexes))
    return _build(
        SlotUtil,
        conn.execute(
            f"SELECT gpu_index, ts_ms / {int(slot_ms)} * {int(slot_ms)} AS slot, avg(gpu_util_pct), "
            f"max(ts_ms) FROM gpu_samples WHERE gpu_index IN ({marks}) AND ts_ms >= ? AND ts_ms < ? "
            "AND gpu_util_pct IS NOT NULL GROUP BY gpu_index, slot",
            (*gpu_indexes, since_ms, until_ms),
        ),
    )


def gpu_processes(conn: sqlite3.Connection, now: int | None = None) -> list[GpuProcess]:
    """Processes in the newest process tick, with their user, command line and run.

    A process tick holds every GPU's processes at one ts_ms, so a GPU absent from the newest
    tick has no processes now; so has every GPU when that tick is older than the newest GPU
    sample by more than PROCESS_TICK_SLACK_MS. The run is processes.run_id, else a running run
    with that pid. kind NULL is stored for 'compute' and read back as such.
    """
    rows = conn.execute(
        distinct_keys("gpu_process_samples", "gpu_index") + ", ticks(gpu_index, ts_ms) AS ("
        "  SELECT k, (SELECT max(ts_ms) FROM gpu_process_samples WHERE gpu_index = k AND ts_ms <= :upto) "
        "  FROM keys WHERE k IS NOT NULL), "
        "newest(ts_ms) AS (SELECT max(ts_ms) FROM ticks "
        "  WHERE (SELECT max(ts_ms) FROM ticks) >= coalesce((SELECT max((SELECT max(g.ts_ms) "
        "    FROM gpu_samples g WHERE g.gpu_index = t.gpu_index AND g.ts_ms <= :upto)) FROM ticks t), 0) "
        f"    - {PROCESS_TICK_SLACK_MS}) "
        "SELECT s.gpu_index, s.pid, s.ts_ms, coalesce(s.kind, 'compute'), s.used_mem_bytes, "
        "  s.sm_util_pct, s.mem_util_pct, s.rss_bytes, s.cpu_pct, p.uid, p.user, p.cmdline, "
        "  coalesce(p.run_id, (SELECT run_id FROM runs WHERE pid = s.pid AND status = 'running' "
        "                      ORDER BY started_ms DESC LIMIT 1)) AS rid, "
        "  NULL, s.gpu_instance_id, s.compute_instance_id "
        "FROM ticks JOIN newest ON ticks.ts_ms = newest.ts_ms "
        "JOIN gpu_process_samples s ON s.gpu_index = ticks.gpu_index AND s.ts_ms = ticks.ts_ms "
        "LEFT JOIN processes p ON p.rowid = (SELECT rowid FROM processes WHERE pid = s.pid "
        "                                    ORDER BY last_seen_ms DESC LIMIT 1) "
        "ORDER BY s.gpu_index, s.used_mem_bytes DESC, s.pid",
        _upto(now),
    ).fetchall()
    names = run_names(conn, {row[12] for row in rows if row[12]})
    return [GpuProcess(*[*row[:13], names.get(row[12]), *row[14:]]) for row in rows]


def mig_devices(conn: sqlite3.Connection, now: int | None = None) -> list[MigDevice]:
    """The MIG devices in each GPU's newest MIG tick, by GPU, GPU instance, compute instance.

    A GPU whose newest MIG tick is older than its newest GPU sample by more than
    PROCESS_TICK_SLACK_MS has none now (MIG mode was turned off, or its devices destroyed).
    """
    rows = conn.execute(
        distinct_keys("mig_samples", "gpu_index") + ", ticks(gpu_index, ts_ms) AS ("
        "  SELECT k, (SELECT max(ts_ms) FROM mig_samples WHERE gpu_index = k AND ts_ms <= :upto) FROM keys"
        "  WHERE k IS NOT NULL) "
        "SELECT d.gpu_index, d.gpu_instance_id, d.compute_instance_id, d.uuid, d.name, "
        "  d.profile, d.mem_total_bytes, d.sm_count, s.ts_ms, s.mem_used_bytes, s.mem_free_bytes, "
        "  s.gpu_util_pct, s.mem_util_pct "
        "FROM ticks JOIN mig_samples s ON s.gpu_index = ticks.gpu_index AND s.ts_ms = ticks.ts_ms "
        "JOIN mig_devices d ON d.gpu_index = s.gpu_index AND d.gpu_instance_id = s.gpu_instance_id "
        "  AND d.compute_instance_id = s.compute_instance_id "
        "WHERE ticks.ts_ms >= coalesce((SELECT max(ts_ms) FROM gpu_samples g "
        f"  WHERE g.gpu_index = ticks.gpu_index AND g.ts_ms <= :upto), 0) - {PROCESS_TICK_SLACK_MS} "
        "ORDER BY s.gpu_index, s.gpu_instance_id, s.compute_instance_id",
        _upto(now),
    )
    return _build(MigDevice, rows)


def run_names(conn: sqlite3.Connection, run_ids: set[str]) -> dict[str, str | None]:
    """{run id: its name} for those of `run_ids` that are stored."""
    if not run_ids:
        return {}
    marks = ", ".join("?" * len(run_ids))
    return dict(conn.execute(f"SELECT run_id, name FROM runs WHERE run_id IN ({marks})", tuple(run_ids)))


# --- runs and steps --------------------------------------------------------------------------


def runs(
    conn: sqlite3.Connection,
    user: str | None = None,
    status: str | None = None,
    since_ms: int | None = None,
    limit: int = 200,
    search: str | None = None,
) -> list[RunSummary]:
    """Runs newest first, with their steps aggregated in one GROUP BY.

    since_ms keeps runs still going at or after that time (not ended, or ended since); search
    keeps runs whose name, command, config, git commit, cwd or notes hold every word of it
    (store/search.py).
    tokens_per_s_avg is tokens / step time over steps that have both, else tokens over the
    wall time from start to the newest step; for a run with generations and no steps, generated
    tokens over generation time (tokens_per_s_last: the newest generation's); peak_mem_bytes is the largest of the steps'
    and generations' mem_peak_bytes and rss_bytes; oom is status 'oom' or a recorded postmortem.
    """
    where: list[str] = []
    params: list[Any] = []
    if user is not None:
        where.append("user = ?")
        params.append(user)
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if since_ms is not None:
        where.append("(ended_ms IS NULL OR ended_ms >= ?)")
        params.append(since_ms)
    if search is not None:
        where.append(MATCHES)
        params += [match_expression(search)] * 2
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    rows = conn.execute(
        f"WITH sel AS (SELECT * FROM runs {clause} ORDER BY started_ms DESC, run_id LIMIT ?), "
        # A steps row may stand for n_steps steps (folded), step_time_ms their mean.
        "agg AS (SELECT run_id, sum(n_steps) AS n, "
        "  sum(CASE WHEN step_time_ms > 0 THEN tokens END) AS timed_tokens, "
        "  sum(CASE WHEN tokens IS NOT NULL THEN step_time_ms * n_steps END) AS step_ms, "
        "  sum(tokens) AS tokens, max(ts_ms) AS newest_ms, "
        "  max(mem_peak_bytes) AS peak_gpu, max(rss_bytes) AS peak_rss, "
        "  max(step) AS last_step "
        "  FROM steps WHERE run_id IN (SELECT run_id FROM sel) GROUP BY run_id), "
        "gen AS (SELECT run_id, sum(CASE WHEN tokens_per_s > 0 THEN new_tokens END) AS new_tokens, "
        "  sum(CASE WHEN tokens_per_s > 0 THEN new_tokens / tokens_per_s END) AS gen_s, "
        "  max(CASE WHEN tokens_per_s > 0 THEN gen_id END) AS last_gen, "
        "  max(mem_peak_bytes) AS peak_gpu, max(rss_bytes) AS peak_rss "
        "  FROM generations WHERE run_id IN (SELECT run_id FROM sel) GROUP BY run_id) "
        "SELECT sel.run_id, sel.job_id, sel.name, sel.user, sel.uid, sel.pid, sel.host, sel.status, "
        "  sel.started_ms, sel.ended_ms, sel.last_step_ms, coalesce(agg.n, 0), "
        "  agg.timed_tokens, agg.step_ms, agg.tokens, agg.newest_ms, "
        "  (SELECT tokens_per_s FROM steps WHERE run_id = sel.run_id AND step = agg.last_step), "
        "  agg.peak_gpu, agg.peak_rss, "
        "  sel.status = 'oom' OR EXISTS (SELECT 1 FROM oom_postmortems o WHERE o.run_id = sel.run_id), "
        "  sel.rank, sel.world_size, gen.new_tokens, gen.gen_s, gen.peak_gpu, gen.peak_rss, "
        "  (SELECT tokens_per_s FROM generations WHERE run_id = sel.run_id AND gen_id = gen.last_gen) "
        "FROM sel LEFT JOIN agg ON agg.run_id = sel.run_id LEFT JOIN gen ON gen.run_id = sel.run_id "
        "ORDER BY sel.started_ms DESC, sel.run_id",
        (*params, limit),
    )
    out = []
    for (
        run_id,
        job_id,
        name,
        user_,
        uid,
        pid,
        host,
        status_,
        started,
        ended,
        last_step_ms,
        n,
        timed_tokens,
        step_ms,
        tokens,
        newest_ms,
        tps_last,
        peak_gpu,
        peak_rss,
        oom,
        rank,
        world_size,
        gen_tokens,
        gen_s,
        gen_peak_gpu,
        gen_peak_rss,
        gen_tps_last,
    ) in rows:
        if not n and gen_s:  # a generation run: decode tokens over decode time
            tps_avg, tps_last = gen_tokens / gen_s, gen_tps_last
        elif timed_tokens is not None and step_ms:
            tps_avg = timed_tokens / (step_ms / 1000.0)
        elif tokens is not None and newest_ms is not None and newest_ms > started:
            tps_avg = tokens / ((newest_ms - started) / 1000.0)
        else:
            tps_avg = None
        peaks = [p for p in (peak_gpu, peak_rss, gen_peak_gpu, gen_peak_rss) if p is not None]
        out.append(
            RunSummary(
                run_id,
                job_id,
                name,
                user_,
                uid,
                pid,
                host,
                status_,
                started,
                ended,
                last_step_ms,
                n,
                tps_avg,
                tps_last,
                max(peaks) if peaks else None,
                bool(oom),
                rank,
                world_size,
            )
        )
    return out


def run_tokens(conn: sqlite3.Connection, run_id: str, since_ms: int, until_ms: int) -> int | None:
    """Tokens a run processed in [since, until]: its steps' tokens, else its generations' new tokens."""
    for sql in (
        "SELECT sum(tokens) FROM steps WHERE run_id = ? AND ts_ms BETWEEN ? AND ?",
        "SELECT sum(new_tokens) FROM generations WHERE run_id = ? AND ts_ms BETWEEN ? AND ?",
    ):
        tokens: int | None = conn.execute(sql, (run_id, since_ms, until_ms)).fetchone()[0]
        if tokens:
            return tokens
    return None


def run_owner(conn: sqlite3.Connection, run_id: str) -> int | None:
    """The uid that created run `run_id` (who may control it), None if there is no such run."""
    row = conn.execute("SELECT uid FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else int(row[0])


def run_count(conn: sqlite3.Connection) -> int:
    """Every run in the database (runs() returns at most its limit of them)."""
    count: int = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
    return count


_RUN_FIELDS = [f.name for f in fields(Run)]
_CONFIG_JSON = _RUN_FIELDS.index("config_json")


def _run_from_row(row: tuple[Any, ...]) -> Run:
    text = row[_CONFIG_JSON]
    try:
        config = json.loads(text) if text else {}
    except ValueError:
        config = {}
    return Run(**dict(zip(_RUN_FIELDS, row)), config=config if isinstance(config, dict) else {})


def run_event_payload(conn: sqlite3.Connection, run_id: str, kind: str = "attached") -> dict[str, Any]:
    """The first `kind` event's payload: what an instrumented child told a `gpuwatch run`
    wrapper's run ('attached': its config, torch version), or why it could not be instrumented
    ('not_instrumented'); {} if none."""
    row = conn.execute(
        "SELECT payload_json FROM run_events WHERE run_id = ? AND kind = ? ORDER BY seq LIMIT 1",
        (run_id, kind),
    ).fetchone()
    try:
        payload = json.loads(row[0]) if row and row[0] else {}
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


@dataclass(frozen=True)
class RankRun:
    run_id: str
    name: str | None
    rank: int | None
    local_rank: int | None
    status: str
    host: str | None


def job_ranks(conn: sqlite3.Connection, run: Run) -> list[RankRun]:
    """The other runs of `run`'s distributed job, or the runs under this wrapper (its ranks, the
    processes of the program that trained beside each other)."""
    rows = conn.execute(
        f"SELECT {columns_of(RankRun)} FROM runs WHERE run_id != ? AND "
        "((job_id IS NOT NULL AND job_id = ?) OR parent_run_id = ?) ORDER BY rank, started_ms",
        (run.run_id, run.job_id, run.run_id),
    ).fetchall()
    return _build(RankRun, rows)


def run_by_id(conn: sqlite3.Connection, run_id: str) -> Run | None:
    """The run with exactly this id, or None."""
    row = conn.execute(f"SELECT {columns_of(Run)} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else _run_from_row(row)


def run(conn: sqlite3.Connection, run_ref: str) -> Run:
    """The run named by its full id, the newest run with that exact name, or a unique id prefix."""
    by_id = run_by_id(conn, run_ref)
    if by_id is not None:
        return by_id
    cols = columns_of(Run)
    row = conn.execute(
        f"SELECT {cols} FROM runs WHERE name = ? ORDER BY started_ms DESC LIMIT 1", (run_ref,)
    ).fetchone()
    if row is None and run_ref:
        # A range on the primary key instead of LIKE, so '_' and '%' in a ref mean themselves.
        found = conn.execute(
            f"SELECT {cols} FROM runs WHERE run_id >= ? AND run_id < ? ORDER BY started_ms DESC LIMIT 6",
            (run_ref, run_ref + "\U0010ffff"),
        ).fetchall()
        if len(found) > 1:
            total = conn.execute(
                "SELECT count(*) FROM runs WHERE run_id >= ? AND run_id < ?",
                (run_ref, run_ref + "\U0010ffff"),
            ).fetchone()[0]
            shown = ", ".join(r[0] for r in found[:5]) + (", ..." if total > 5 else "")
            raise StoreError(f"'{run_ref}' matches {total} runs: {shown}")
        row = found[0] if found else None
    if row is None:
        raise StoreError(f"no run matches '{run_ref}'")
    return _run_from_row(row)


@dataclass(frozen=True)
class Note:
    ts_ms: int
    uid: int
    user: str | None
    text: str


def notes(conn: sqlite3.Connection, run_id: str) -> list[Note]:
    """The notes left on a run, oldest first."""
    return [
        Note(*r)
        for r in conn.execute(
            f"SELECT {columns_of(Note)} FROM run_notes WHERE run_id = ? ORDER BY ts_ms, id", (run_id,)
        )
    ]


def steps(
    conn: sqlite3.Connection, run_id: str, since_ms: int | None = None, limit: int | None = None
) -> list[StepRow]:
    """A run's steps in step order; limit keeps the newest `limit` of them."""
    where = "run_id = ?"
    params: list[Any] = [run_id]
    if since_ms is not None:
        where += " AND ts_ms >= ?"
        params.append(since_ms)
    sql = f"SELECT {columns_of(StepRow)} FROM steps WHERE {where} ORDER BY step DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return _build(StepRow, reversed(conn.execute(sql, params).fetchall()))


__all__ = [
    "GpuInfo",
    "GpuSample",
    "GpuProfSample",
    "HostSample",
    "GpuProcess",
    "RunSummary",
    "Run",
    "StepRow",
    "SeriesPoint",
    "MigDevice",
    "gpus",
    "latest_gpu_samples",
    "latest_gpu_prof_samples",
    "gpu_series",
    "latest_host_sample",
    "host_series",
    "gpu_processes",
    "mig_devices",
    "runs",
    "run_count",
    "run_tokens",
    "run",
    "run_by_id",
    "run_names",
    "steps",
    "series_tier",
]

"""The database schema, as an ordered list of migrations.

Conventions: timestamps are integer milliseconds since the Unix epoch in `*_ms` columns;
sizes are bytes (`*_bytes`); units live in column names. Sample tables are WITHOUT ROWID
with a (key, ts_ms) primary key so a sample costs little more than its values and a time
range of one key is a seek. For a while the raw GPU, GPU-process and host samples were views
over plain and packed tables (store/packed.py); they are plain tables again.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from gpuwatch.store import packed, search

# Metrics of gpu_samples and host_samples that the rollup tiers keep as min/avg/max.
GPU_METRICS = (
    "gpu_util_pct",
    "mem_util_pct",
    "mem_used_bytes",
    "mem_free_bytes",
    "temp_c",
    "power_mw",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "pcie_tx_kbps",
    "pcie_rx_kbps",
    "fan_pct",
)
HOST_METRICS = (
    "cpu_pct",
    "load1",
    "mem_used_bytes",
    "mem_available_bytes",
    "swap_used_bytes",
    "shm_used_bytes",
)


QUARTER_HOUR_MS = 900_000  # the finer rollup tier's period (it was a minute in schema version 1)


def rollup_avg(metric: str, expr: str) -> str:
    """Averages of byte/mW/MHz/kbps metrics are kept as whole units: an integer takes 1-6
    bytes on disk where a REAL takes 8, and a fraction of a byte or milliwatt means nothing."""
    if metric.endswith(("_bytes", "_mw", "_mhz", "_kbps")):
        return f"CAST(round({expr}) AS INTEGER)"
    return expr


def coarser_values(metrics: tuple[str, ...]) -> str:
    """SELECT list folding rows of a rollup tier into longer periods: n, then min/avg/max per
    metric. The average weights each row by its sample count (n counts rows, so a metric
    missing in some rows is weighted by the rows where it was present)."""
    return "sum(n), " + ", ".join(
        f"min({m}_min), "
        + rollup_avg(m, f"sum({m}_avg * n) * 1.0 / sum(CASE WHEN {m}_avg IS NOT NULL THEN n END)")
        + f", max({m}_max)"
        for m in metrics
    )


def _rollup_table(name: str, key: str | None, metrics: tuple[str, ...]) -> str:
    """A min/avg/max tier: one row per (key, period start); n = raw samples folded in."""
    key_col = f"{key} INTEGER NOT NULL, " if key else ""
    pk = f"{key}, ts_ms" if key else "ts_ms"
    cols = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in metrics)
    return (
        f"CREATE TABLE {name} ({key_col}ts_ms INTEGER NOT NULL, n INTEGER NOT NULL, "
        f"{cols}, PRIMARY KEY ({pk})) WITHOUT ROWID;"
    )


_V1 = """
CREATE TABLE gpus (                      -- static facts, read once per GPU
  gpu_index INTEGER PRIMARY KEY,
  uuid TEXT NOT NULL,
  name TEXT,
  pci_bus_id TEXT,
  mem_total_bytes INTEGER,
  power_limit_mw INTEGER,
  mig_mode INTEGER,
  driver_version TEXT,
  cuda_driver_version TEXT,
  first_seen_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL,
  state TEXT NOT NULL DEFAULT 'ok'       -- ok | lost
);

CREATE TABLE gpu_samples (
  gpu_index INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  gpu_util_pct INTEGER, mem_util_pct INTEGER,
  mem_used_bytes INTEGER, mem_free_bytes INTEGER, mem_reserved_bytes INTEGER,
  temp_c INTEGER, power_mw INTEGER, energy_mj INTEGER,
  sm_clock_mhz INTEGER, mem_clock_mhz INTEGER,
  pcie_tx_kbps INTEGER, pcie_rx_kbps INTEGER,
  fan_pct INTEGER, pstate INTEGER,
  throttle_reasons INTEGER,              -- NVML clock-event reason bitmask
  ecc_corrected INTEGER, ecc_uncorrected INTEGER,   -- volatile counts
  state TEXT,                            -- NULL = ok; 'lost' when the GPU fell off the bus
  PRIMARY KEY (gpu_index, ts_ms)
) WITHOUT ROWID;

CREATE TABLE xid_events (
  ts_ms INTEGER NOT NULL,
  gpu_index INTEGER NOT NULL,
  xid INTEGER NOT NULL,
  PRIMARY KEY (gpu_index, ts_ms, xid)
) WITHOUT ROWID;

CREATE TABLE processes (                 -- one row per process ever seen on a GPU or in a run
  pid INTEGER NOT NULL,
  start_ms INTEGER NOT NULL,             -- pid + start time identify a process across pid reuse
  uid INTEGER, user TEXT, cmdline TEXT,
  container_id TEXT,
  slurm_job_id TEXT, rank INTEGER, local_rank INTEGER, world_size INTEGER,
  cuda_visible_devices TEXT,
  run_id TEXT,
  first_seen_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL,
  PRIMARY KEY (pid, start_ms)
);

CREATE TABLE gpu_process_samples (
  gpu_index INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  kind TEXT,                             -- NULL = compute (the usual case) | graphics | compute+graphics
  used_mem_bytes INTEGER,
  sm_util_pct INTEGER, mem_util_pct INTEGER,
  rss_bytes INTEGER, cpu_pct REAL,
  PRIMARY KEY (gpu_index, ts_ms, pid)    -- ts before pid: the newest tick and retention are range scans
) WITHOUT ROWID;

CREATE TABLE host_samples (
  ts_ms INTEGER PRIMARY KEY,
  cpu_pct REAL, load1 REAL, load5 REAL, load15 REAL,
  mem_total_bytes INTEGER, mem_used_bytes INTEGER, mem_available_bytes INTEGER,
  swap_used_bytes INTEGER,
  disk_read_bytes INTEGER, disk_write_bytes INTEGER,   -- cumulative counters
  net_rx_bytes INTEGER, net_tx_bytes INTEGER,          -- cumulative counters
  shm_total_bytes INTEGER, shm_used_bytes INTEGER
) WITHOUT ROWID;

CREATE TABLE runs (
  run_id TEXT PRIMARY KEY,               -- client-made, unique; events refer to it
  job_id TEXT,                           -- groups the ranks of one torchrun/Slurm job
  name TEXT,
  uid INTEGER NOT NULL,                  -- from SO_PEERCRED, never from the message
  user TEXT,
  pid INTEGER,
  host TEXT,
  status TEXT NOT NULL DEFAULT 'running',-- running | finished | failed | oom | killed | lost
  exit_code INTEGER, signal INTEGER, error_type TEXT, error_message TEXT,
  started_ms INTEGER NOT NULL,
  ended_ms INTEGER,
  last_step_ms INTEGER,
  command TEXT, cwd TEXT, git_commit TEXT,
  config_json TEXT,
  torch_version TEXT, cuda_version TEXT,
  gpu_uuids TEXT,                        -- comma-separated, from CUDA_VISIBLE_DEVICES
  rank INTEGER, local_rank INTEGER, world_size INTEGER,
  slurm_job_id TEXT,
  parent_run_id TEXT,                    -- `gpuwatch run` wrapper that an instrumented child joined
  flops_per_token REAL,
  mode TEXT                              -- daemon | embedded
);
CREATE INDEX runs_started ON runs(started_ms);
CREATE INDEX runs_status ON runs(status);

CREATE TABLE steps (
  run_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  tokens INTEGER, samples INTEGER, seq_len INTEGER,
  loss REAL,
  step_time_ms REAL,
  tokens_per_s REAL,
  mfu REAL,
  mem_allocated_bytes INTEGER, mem_reserved_bytes INTEGER, mem_peak_bytes INTEGER,
  rss_bytes INTEGER,
  PRIMARY KEY (run_id, step)
) WITHOUT ROWID;

CREATE TABLE generations (
  run_id TEXT NOT NULL,
  gen_id INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  prompt_tokens INTEGER, new_tokens INTEGER,
  ttft_ms REAL, itl_p50_ms REAL, itl_p90_ms REAL,
  tokens_per_s REAL,
  PRIMARY KEY (run_id, gen_id)
) WITHOUT ROWID;

CREATE TABLE memory_stats (              -- full torch.cuda.memory_stats() every N steps
  run_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  device INTEGER NOT NULL DEFAULT 0,
  num_alloc_retries INTEGER, num_ooms INTEGER,
  inactive_split_bytes INTEGER,
  stats_json TEXT,
  PRIMARY KEY (run_id, step, device)
) WITHOUT ROWID;

CREATE TABLE run_events (                -- free-form run events: idempotent by (run_id, seq)
  run_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  kind TEXT NOT NULL,
  payload_json TEXT,
  PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

CREATE TABLE oom_postmortems (
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  ts_ms INTEGER NOT NULL,
  kind TEXT NOT NULL,                    -- gpu | host
  device INTEGER,
  requested_bytes INTEGER,
  total_bytes INTEGER, free_bytes INTEGER,
  allocated_bytes INTEGER, reserved_bytes INTEGER,
  rss_bytes INTEGER, available_bytes INTEGER, cgroup_limit_bytes INTEGER,
  step INTEGER, seq_len INTEGER, batch INTEGER, phase TEXT,
  error_message TEXT,
  traceback TEXT,
  memory_summary TEXT,
  stats_json TEXT,
  largest_blocks_json TEXT,              -- [{size_bytes, stack: [...]}, ...]
  neighbours_json TEXT,                  -- [{pid, user, used_mem_bytes, run_id}, ...] on that GPU
  advice_json TEXT,                      -- [{title, detail}, ...], computed from the numbers
  snapshot_path TEXT                     -- memory_viz pickle, if recorded
);
CREATE INDEX oom_run ON oom_postmortems(run_id);

CREATE TABLE profiles (
  id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  ts_ms INTEGER NOT NULL,
  rank INTEGER,
  trigger TEXT NOT NULL,                 -- scheduled | on_demand
  first_step INTEGER, steps INTEGER,
  trace_path TEXT, trace_bytes INTEGER
);
CREATE INDEX profiles_run ON profiles(run_id);

CREATE TABLE profile_ops (
  profile_id INTEGER NOT NULL,
  name TEXT NOT NULL,
  calls INTEGER,
  self_cpu_us REAL, cpu_total_us REAL,
  self_device_us REAL, device_total_us REAL,
  self_mem_bytes INTEGER,
  PRIMARY KEY (profile_id, name)
) WITHOUT ROWID;

CREATE TABLE stack_dumps (
  id INTEGER PRIMARY KEY,
  run_id TEXT,
  pid INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  reason TEXT NOT NULL,                  -- stall | on_demand
  stacks_json TEXT,                      -- py-spy dump --json output
  error TEXT                             -- why no stacks (e.g. ptrace not permitted)
);
CREATE INDEX stack_dumps_run ON stack_dumps(run_id);

CREATE TABLE capacity_points (
  study_id INTEGER NOT NULL,
  batch INTEGER NOT NULL,
  seq_len INTEGER NOT NULL,
  peak_bytes INTEGER,
  ok INTEGER NOT NULL,                   -- 0 if the point itself ran out of memory
  kind TEXT NOT NULL,                    -- measured | verify
  PRIMARY KEY (study_id, batch, seq_len, kind)
) WITHOUT ROWID;

CREATE TABLE capacity_studies (
  id INTEGER PRIMARY KEY,
  ts_ms INTEGER NOT NULL,
  uid INTEGER,
  command TEXT NOT NULL,
  device TEXT,                           -- GPU name or 'cpu'
  limit_bytes INTEGER, margin REAL,
  fit_json TEXT,                         -- {batch: {a, b, c}}
  predicted_json TEXT                    -- {batch: {max_seq_len, predicted_peak_bytes, verified_peak_bytes}}
);

CREATE TABLE rollup_state (              -- rollup high-water marks: periods before done_until_ms are folded in
  tier TEXT PRIMARY KEY,                 -- destination table, e.g. gpu_samples_1h
  done_until_ms INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE daemon_stats (              -- the monitor's own cost, published and queryable
  ts_ms INTEGER PRIMARY KEY,
  cpu_pct REAL, rss_bytes INTEGER,
  tick_ms REAL, queue_depth INTEGER, dropped_events INTEGER, db_bytes INTEGER
) WITHOUT ROWID;
"""

_V1_ROLLUPS = "\n".join(
    _rollup_table(f"{src}_samples_{tier}", key, metrics)
    for tier in ("1m", "1h")
    for src, key, metrics in (("gpu", "gpu_index", GPU_METRICS), ("host", None, HOST_METRICS))
)

# MIG devices of MIG-enabled GPUs, their memory, and which one each GPU process runs on.
_MIG = """
CREATE TABLE mig_devices (               -- one per GPU instance + compute instance ever seen
  gpu_index INTEGER NOT NULL,            -- the parent GPU
  gpu_instance_id INTEGER NOT NULL,      -- DCGM's GPU_I_ID
  compute_instance_id INTEGER NOT NULL,
  uuid TEXT NOT NULL,                    -- MIG-...
  name TEXT,
  profile TEXT,                          -- e.g. 1g.10gb: DCGM's GPU_I_PROFILE
  mem_total_bytes INTEGER,
  sm_count INTEGER,
  first_seen_ms INTEGER NOT NULL,
  last_seen_ms INTEGER NOT NULL,
  PRIMARY KEY (gpu_index, gpu_instance_id, compute_instance_id)
);

CREATE TABLE mig_samples (               -- written with the process samples, at their cadence
  gpu_index INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  gpu_instance_id INTEGER NOT NULL,
  compute_instance_id INTEGER NOT NULL,
  mem_used_bytes INTEGER, mem_free_bytes INTEGER,
  gpu_util_pct INTEGER, mem_util_pct INTEGER,   -- NULL when NVML gives none (most MIG devices)
  PRIMARY KEY (gpu_index, ts_ms, gpu_instance_id, compute_instance_id)
) WITHOUT ROWID;

-- The MIG device a GPU process runs on; NULL off MIG.
ALTER TABLE gpu_process_samples ADD COLUMN gpu_instance_id INTEGER;
ALTER TABLE gpu_process_samples ADD COLUMN compute_instance_id INTEGER;
"""


def _quarter_hour_tiers() -> str:
    """The minute tiers become 15-minute tiers: existing minutes folded in, the tier's
    high-water mark moved back to a period start (the raw samples of the part period are
    still there and are rolled up again)."""
    out = []
    for src, key, metrics in (("gpu", "gpu_index", GPU_METRICS), ("host", None, HOST_METRICS)):
        old, new = f"{src}_samples_1m", f"{src}_samples_15m"
        key_col = f"{key}, " if key else ""
        cols = ", ".join(f"{m}_min, {m}_avg, {m}_max" for m in metrics)
        out += [
            _rollup_table(new, key, metrics),
            f"INSERT INTO {new} ({key_col}ts_ms, n, {cols}) SELECT {key_col}"
            f"ts_ms / {QUARTER_HOUR_MS} * {QUARTER_HOUR_MS} AS period, {coarser_values(metrics)} "
            f"FROM {old} WHERE ts_ms < coalesce((SELECT done_until_ms / {QUARTER_HOUR_MS} * "
            f"{QUARTER_HOUR_MS} FROM rollup_state WHERE tier = '{old}'), 0) GROUP BY {key_col}period;",
            f"DROP TABLE {old};",
            f"UPDATE rollup_state SET tier = '{new}', done_until_ms = done_until_ms / {QUARTER_HOUR_MS} "
            f"* {QUARTER_HOUR_MS} WHERE tier = '{old}';",
        ]
    return "\n".join(out)


# Raw samples: plain `_recent` rows plus `_packed` buckets, read through views (store/packed.py);
# rollups every 15 minutes instead of every minute (rollups at ~1 % of the packed raw tier).
_COMPACT_SAMPLES = packed.migration_sql() + "\n" + _quarter_hour_tiers()


def _plain_raw_samples() -> str:
    """The packed raw tier back into plain tables: each view's rows (its plain rows and every
    bucket decoded) go into its `_recent` table, which takes the view's name again. A
    hand-written time filter seeks the primary key again, where through the view it decoded
    every bucket (36-50x slower)."""
    out = []
    for t in packed.TABLES.values():
        out += [
            f"INSERT OR IGNORE INTO {t.recent} SELECT * FROM {t.name};",
            f"DROP VIEW {t.name};",  # and its INSTEAD OF trigger with it
            f"DROP TABLE {t.packed};",
            f"ALTER TABLE {t.recent} RENAME TO {t.name};",
            f"DELETE FROM rollup_state WHERE tier = '{t.packed}';",
        ]
    return "\n".join(out + ["DROP TABLE sample_slots;"])


_PLAIN_RAW_SAMPLES = _plain_raw_samples()

# A generation records the run's peak memory so far, as a step does: a decode-only run has no steps.
_GENERATION_MEMORY = """
ALTER TABLE generations ADD COLUMN mem_peak_bytes INTEGER;   -- CUDA allocator peak so far
ALTER TABLE generations ADD COLUMN rss_bytes INTEGER;        -- host RSS at the generation's end
"""

# Always-on answers to "why is my run slow", without a profile: per step, the share spent
# before its compute began (waiting for data, from Run.mark_compute(); NULL where nothing marked
# it); per GPU with GPM (Hopper and later), SM / tensor / DRAM activity over each GPU tick.
_ALWAYS_ON = """
ALTER TABLE steps ADD COLUMN data_wait_pct REAL;

CREATE TABLE gpu_prof_samples (          -- GPM figures, 0-100 over the tick; GPUs without GPM have no rows
  gpu_index INTEGER NOT NULL,
  ts_ms INTEGER NOT NULL,
  sm_active_pct REAL,                    -- SMs with a warp resident (DCGM_FI_PROF_SM_ACTIVE)
  sm_occupancy_pct REAL,                 -- resident warps vs the SMs' maximum (DCGM_FI_PROF_SM_OCCUPANCY)
  tensor_active_pct REAL,                -- any tensor pipe busy (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
  dram_active_pct REAL,                  -- DRAM bandwidth used vs peak (DCGM_FI_PROF_DRAM_ACTIVE)
  PRIMARY KEY (gpu_index, ts_ms)
) WITHOUT ROWID;
"""

# The trace analysis of each profile (gpuwatch/analysis/trace): headline figures as columns for
# queries, the whole breakdown (one rank of `gpuwatch trace --format json`) as JSON for screens.
_PROFILE_BREAKDOWNS = """
CREATE TABLE profile_breakdowns (
  profile_id INTEGER PRIMARY KEY REFERENCES profiles(id),
  gpu INTEGER NOT NULL,                  -- 1: the trace has GPU activity; 0: CPU only
  kernel_time_us REAL,                   -- first GPU event start to last end (HTA's kernel time)
  idle_pct REAL, compute_pct REAL, non_compute_pct REAL,   -- of kernel_time_us
  idle_host_wait_pct REAL, idle_dataloader_pct REAL,       -- of the idle time
  idle_sync_pct REAL, idle_other_pct REAL,
  overlap_pct REAL,                      -- NCCL time overlapped by compute
  cpu_operators_pct REAL, cpu_dataloader_pct REAL,         -- of the steps' CPU wall time
  cpu_optimizer_pct REAL, cpu_other_pct REAL,
  advice_json TEXT,                      -- list of advice lines
  breakdown_json TEXT NOT NULL           -- kernels, groups, per-step figures, operators
);
"""

# A GPU's state may now also be 'hung' (its NVML calls block: "not responding"), and says
# since when it has been in that state.
_GPU_STATE_SINCE = """
ALTER TABLE gpus ADD COLUMN state_since_ms INTEGER;  -- when `state` last changed
"""

# Alert events: one row per incident (UNIQUE (kind, incident) makes a repeat a no-op), written
# by the rules (gpuwatch/alerts). No subscription URL is ever stored here: URLs are secrets kept
# by their owners (see gpuwatch/alerts), and this file is readable by every user.
_ALERTS = """
CREATE TABLE alerts (
  id INTEGER PRIMARY KEY,
  ts_ms INTEGER NOT NULL,                -- when the event happened (or its threshold was met)
  kind TEXT NOT NULL,                    -- run.finished, run.failed, run.oom, ..., gpu.idle_held, gpus.free
  incident TEXT NOT NULL,                -- what makes it one incident: a second alert for it is ignored
  host TEXT NOT NULL,
  uid INTEGER,                           -- whose: the run's or the process's owner; NULL for a GPU or the host
  run_id TEXT, gpu_index INTEGER, pid INTEGER,
  title TEXT NOT NULL, body TEXT NOT NULL,
  detail_json TEXT,                      -- the figures it rests on
  UNIQUE (kind, incident)
);
CREATE INDEX alerts_uid ON alerts (uid, id);
CREATE INDEX alerts_run ON alerts (run_id);
"""

# A steps row may stand for several steps: past the transport's budget the client folds them
# into one row per short window (`step` is the window's last step; tokens and samples are sums,
# loss and step time means). Count steps by n_steps, never by rows. With several optimisers
# (a GAN's D and G), each one's loss, named after the program's module where it can be found.
_FOLDED_STEPS = """
ALTER TABLE steps ADD COLUMN n_steps INTEGER NOT NULL DEFAULT 1;  -- steps this row stands for
ALTER TABLE steps ADD COLUMN losses_json TEXT;  -- {"netD": 1.21, "netG": 0.83}: per-optimiser loss
"""

# Evidence for "why did my run slow down": the few top CPU consumers of the whole host at each
# process tick (on a GPU or not), and the host's memory pressure.
_SLOWDOWN_EVIDENCE = """
CREATE TABLE host_top_processes (
  ts_ms INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  start_ms INTEGER,                      -- with pid, identifies the process across pid reuse
  uid INTEGER, user TEXT, cmdline TEXT,
  cpu_pct REAL,                          -- % of one core since the previous process tick
  rss_bytes INTEGER,
  PRIMARY KEY (ts_ms, pid)
) WITHOUT ROWID;
ALTER TABLE host_samples ADD COLUMN swap_in_bytes INTEGER;    -- cumulative counters
ALTER TABLE host_samples ADD COLUMN swap_out_bytes INTEGER;
ALTER TABLE host_samples ADD COLUMN page_cache_bytes INTEGER;
"""

# Alert rules' state (gpuwatch/alerts): a condition that must hold for a while (a GPU held idle,
# throttled, a disk low) is an episode; kept here so a restart neither repeats its alert nor
# restarts its clock. And the `gpuwatch notify when-free` wishes, until one fires (no URLs here).
_ALERT_RULES = """
CREATE TABLE alert_episodes (
  key TEXT PRIMARY KEY,                  -- what holds: 'gpu.idle_held:GPU-…:pid:start_ms'
  since_ms INTEGER NOT NULL,             -- when it began; the alert's incident is key@since_ms
  fired INTEGER NOT NULL DEFAULT 0       -- 1 once its alert is written; the row goes on release
) WITHOUT ROWID;
CREATE TABLE alert_wishes (
  id INTEGER PRIMARY KEY,
  uid INTEGER NOT NULL,                  -- from SO_PEERCRED (or this user, embedded)
  user TEXT,
  host TEXT NOT NULL,
  created_ms INTEGER NOT NULL,
  gpus INTEGER NOT NULL,                 -- GPUs wanted on this host
  min_free_bytes INTEGER NOT NULL,       -- free memory each must keep
  max_util_pct REAL NOT NULL,
  window_min REAL NOT NULL               -- minutes of samples to judge by, as `gpuwatch pick`
);
"""

# A folded steps row's fastest and slowest step (step_time_ms is then their mean); NULL on a
# row of one step, whose step_time_ms is all three.
_FOLDED_STEP_TIMES = """
ALTER TABLE steps ADD COLUMN step_time_min_ms REAL;
ALTER TABLE steps ADD COLUMN step_time_max_ms REAL;
"""

# Where a step's time went, as the zero-code hooks split it (shares of the step, host clock):
# data_wait_pct (inside the data loader), compute_pct (first training forward to the step's end),
# eval_pct (evaluation forwards and torch.save between steps); the rest is "other". A closure
# optimiser (LBFGS) evaluates its closure several times a step: how many.
_STEP_SPLIT = """
ALTER TABLE steps ADD COLUMN compute_pct REAL;
ALTER TABLE steps ADD COLUMN eval_pct REAL;
ALTER TABLE steps ADD COLUMN closure_evals INTEGER;
"""

# Each entry is one schema version; index + 1 is the version number stored in user_version.
# An entry is an SQL script, or a function given the connection inside the migration's
# transaction, for what SQL alone cannot do (sqlite-utils' FTS set-up, `table.transform()`).
# transform() rebuilds rowid tables only (it copies `rowid`; WITHOUT ROWID tables have none),
# and a rebuilt table loses its triggers: transforming `runs` must run search.add_search's
# trigger part again.
Migration = str | Callable[[sqlite3.Connection], None]

MIGRATIONS: list[Migration] = [
    _V1 + _V1_ROLLUPS,
    _MIG,
    _COMPACT_SAMPLES,
    _PLAIN_RAW_SAMPLES,
    _GENERATION_MEMORY,
    _ALWAYS_ON,
    search.add_search,
    _PROFILE_BREAKDOWNS,
    _GPU_STATE_SINCE,
    _ALERTS,
    _FOLDED_STEPS,
    _SLOWDOWN_EVIDENCE,
    _ALERT_RULES,
    _FOLDED_STEP_TIMES,
    _STEP_SPLIT,
]
SCHEMA_VERSION = len(MIGRATIONS)

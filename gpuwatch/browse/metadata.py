"""What `gpuwatch browse` tells Datasette: table and column descriptions with units, canned
queries and the chart each one opens with.

Column descriptions come from the schema itself (gpuwatch/store/schema.py and the migrations
after it): the comment on a column's line, plus its unit read from its name (`_ms`, `_bytes`,
`_mw`...), the naming rule every column follows. Nothing here imports Datasette.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlencode

from gpuwatch.store import search
from gpuwatch.store.schema import MIGRATIONS

# What one row of each user-facing table or view is; docs/database.md's table of tables says the same.
TABLES = {
    "gpus": "One row per GPU: static facts read once (name, UUID, PCI bus id, memory, power limit, MIG mode, driver).",
    "gpu_samples": "One row per GPU and tick: utilisation, memory, temperature, power, energy, clocks, PCIe, fan, throttle reasons, ECC. Raw samples, kept raw_retention_hours.",
    "gpu_samples_15m": "One row per GPU and 15 minutes: min/avg/max of each metric over the period; n = samples folded in.",
    "gpu_samples_1h": "One row per GPU and hour: min/avg/max of each metric over the period; n = samples folded in.",
    "host_samples": "One row per tick: host CPU, load, memory, swap, disk and network counters, /dev/shm. Raw samples.",
    "host_samples_15m": "One row per 15 minutes: min/avg/max of each host metric; n = samples folded in.",
    "host_samples_1h": "One row per hour: min/avg/max of each host metric; n = samples folded in.",
    "processes": "One row per process seen on a GPU or in a run (pid + start time): user, command, container, Slurm/rank tags, run.",
    "gpu_prof_samples": "One row per GPU and tick, for GPUs with NVML GPM (Hopper and later): SM activity, SM occupancy, tensor-core and DRAM activity (0-100 %).",
    "gpu_process_samples": "One row per GPU process and process tick: GPU memory, SM/memory utilisation, RSS, CPU, MIG device.",
    "mig_devices": "One row per MIG device (GPU, GPU instance, compute instance): UUID, profile, memory, SM count.",
    "mig_samples": "One row per MIG device and process tick: memory used/free, utilisation.",
    "xid_events": "One row per XID error reported by the driver.",
    "runs": "One row per run: who (uid from the socket), what (command, config, git commit, ranks, job), where, how it ended.",
    "steps": "One row per training step of a run: tokens, loss, step time, tokens/s, MFU, memory.",
    "generations": "One row per generation call of a run: prompt and new tokens, time to first token, inter-token latency.",
    "memory_stats": "One row per run, step and device every N steps: torch.cuda.memory_stats().",
    "run_events": "One row per free-form run event.",
    "run_notes": "One row per note left on a run (gpuwatch note), by its owner or root.",
    "oom_postmortems": "One row per out-of-memory failure, with neighbours and advice as JSON.",
    "profiles": "One row per profiler window of a run.",
    "profile_ops": "One row per profile and operator: its calls and CPU/device time.",
    "profile_breakdowns": "One row per profile whose trace was analysed: GPU idle / compute / "
    "non-compute %, what the idle waited for, overlap, CPU-side split, advice.",
    "stack_dumps": "One row per py-spy dump of a run's process.",
    "capacity_studies": "One row per gpuwatch capacity study.",
    "capacity_points": "One row per study, batch and sequence length measured.",
    "daemon_stats": "One row per 30 s: the monitor's own CPU, RSS, tick time, queue depth, database size.",
    "alerts": "One row per alert incident (a run's end, failure, OOM, stall; a GPU held idle, lost or hung; "
    "a low disk; a free-GPU wish granted): kind, whose, title, body, figures as JSON. "
    "Never a subscription or its URL: those are secrets kept elsewhere.",
    "alert_episodes": "One row per condition an alert rule is timing now (a GPU held idle, throttled, a disk low): "
    "since when, and whether its alert fired. Gone once the condition ends.",
    "alert_wishes": "One row per `gpuwatch notify when-free` wish not granted yet: who, how many GPUs, how much free memory.",
}

_EPOCH_MS = "ms since the Unix epoch (UTC)"
# Unit by name suffix; durations in ms are named for what they time.
_UNITS = (
    ("_bytes", "bytes"),
    ("_mw", "milliwatts"),
    ("_mj", "millijoules"),
    ("_pct", "percent"),
    ("_mhz", "MHz"),
    ("_kbps", "KB/s"),
    ("_us", "microseconds"),
    ("temp_c", "degrees Celsius"),
    ("tokens_per_s", "tokens per second"),
    ("_per_s", "per second"),
    ("time_ms", "milliseconds"),
    ("tick_ms", "milliseconds"),
    ("ttft_ms", "milliseconds"),
    ("p50_ms", "milliseconds"),
    ("p90_ms", "milliseconds"),
    ("_ms", _EPOCH_MS),
)
_ROLLUP = {"_min": "minimum", "_avg": "average", "_max": "maximum"}
_COLUMN = re.compile(r"\b([a-z_][a-z0-9_]*)\s+(?:INTEGER|REAL|TEXT|BLOB)\b")
_CREATE = re.compile(r"CREATE TABLE (\w+)")


def unit(column: str) -> str | None:
    base = column
    for suffix in _ROLLUP:
        if column.endswith(suffix):
            base = column[: -len(suffix)]
    return next((u for suffix, u in _UNITS if base.endswith(suffix)), None)


def schema_comments() -> dict[str, dict[str, str]]:
    """{table: {column: comment}} from the `-- ...` on each column's line of the schema SQL."""
    scripts = [m for m in MIGRATIONS if isinstance(m, str)] + [search.NOTES_SQL]
    out: dict[str, dict[str, str]] = {}
    table = None
    for line in "\n".join(scripts).splitlines():
        create = _CREATE.search(line)
        if create:
            table = create.group(1)
            continue
        code, _, comment = line.partition("--")
        if table and comment.strip():
            for column in _COLUMN.findall(code):
                out.setdefault(table, {})[column] = comment.strip()
        if code.strip().startswith(")"):
            table = None
    return out


def column_description(table: str, column: str, comments: dict[str, dict[str, str]]) -> str:
    parts = []
    for suffix, word in _ROLLUP.items():
        if column.endswith(suffix) and table.endswith(("_15m", "_1h")):
            parts.append(f"{word} of {column[: -len(suffix)]} over the period")
    if column == "ts_ms" and table.endswith(("_15m", "_1h")):
        parts.append("start of the period")
    comment = comments.get(table, {}).get(column)
    if comment:
        parts.append(comment)
    u = unit(column)
    if u:
        parts.append(u)
    return "; ".join(parts)


# Canned queries: title, SQL, description, chart (datasette-vega's settings, in the page's URL
# fragment). The first six are docs/database.md's worked queries, word for word.
QUERIES: dict[str, dict[str, Any]] = {
    "tokens_per_s_per_run": {
        "title": "Tokens/s and peak memory per run, last 24 h",
        "sql": """-- tokens/s and peak memory per run, runs started in the last 24 h
SELECT r.run_id, r.name, r.user, r.status, round(avg(s.tokens_per_s)) AS tok_s_avg,
       round(max(s.mem_peak_bytes) / 1073741824.0, 2) AS peak_gib
FROM runs r JOIN steps s USING (run_id)
WHERE r.started_ms >= (unixepoch() - 86400) * 1000
GROUP BY r.run_id ORDER BY tok_s_avg DESC;""",
        "chart": {
            "mark": "bar",
            "x_column": "run_id",
            "x_type": "ordinal",
            "y_column": "tok_s_avg",
            "y_type": "quantitative",
        },
    },
    "who_used_gpu_3": {
        "title": "Who used GPU 3, last 24 h",
        "sql": """-- who used GPU 3 in the last 24 h
SELECT p.user, p.pid, p.run_id, count(*) AS samples,
       round(max(g.used_mem_bytes) / 1073741824.0, 1) AS max_gib,
       datetime(min(g.ts_ms) / 1000, 'unixepoch', 'localtime') AS first_seen,
       datetime(max(g.ts_ms) / 1000, 'unixepoch', 'localtime') AS last_seen
FROM gpu_process_samples g
JOIN processes p ON p.pid = g.pid AND g.ts_ms BETWEEN p.first_seen_ms AND p.last_seen_ms
WHERE g.gpu_index = 3 AND g.ts_ms >= (unixepoch() - 86400) * 1000
GROUP BY p.user, p.pid, p.run_id ORDER BY max_gib DESC;""",
        "chart": {
            "mark": "bar",
            "x_column": "user",
            "x_type": "ordinal",
            "y_column": "max_gib",
            "y_type": "quantitative",
        },
    },
    "peak_memory_by_seq_len": {
        "title": "Peak memory by sequence length",
        "sql": """-- peak memory by sequence length
SELECT seq_len, count(DISTINCT run_id) AS runs, round(max(mem_peak_bytes) / 1073741824.0, 2) AS peak_gib
FROM steps WHERE seq_len IS NOT NULL GROUP BY seq_len ORDER BY seq_len;""",
        "chart": {
            "mark": "line",
            "x_column": "seq_len",
            "x_type": "quantitative",
            "y_column": "peak_gib",
            "y_type": "quantitative",
        },
    },
    "ooms_this_week": {
        "title": "OOMs this week, with the other processes on that GPU",
        "sql": """-- OOMs this week, with the other processes on that GPU
SELECT datetime(o.ts_ms / 1000, 'unixepoch', 'localtime') AS at, r.name, r.user, o.device,
       o.seq_len, o.batch, o.requested_bytes / 1048576 AS req_mib, o.free_bytes / 1048576 AS free_mib,
       (SELECT group_concat(json_extract(n.value, '$.user') || ' ' ||
               (json_extract(n.value, '$.used_mem_bytes') / 1073741824) || ' GiB', ', ')
        FROM json_each(o.neighbours_json) n) AS neighbours
FROM oom_postmortems o JOIN runs r USING (run_id)
WHERE o.ts_ms >= (unixepoch() - 7 * 86400) * 1000 ORDER BY o.ts_ms DESC;""",
        "chart": {
            "mark": "bar",
            "x_column": "at",
            "x_type": "temporal",
            "y_column": "req_mib",
            "y_type": "quantitative",
        },
    },
    "utilisation_vs_sm_activity": {
        "title": "Utilisation against SM, tensor-core and DRAM activity, last hour",
        "sql": """-- "utilisation" (a kernel was running) against what the SMs and tensor cores did, last hour
SELECT p.gpu_index, round(avg(g.gpu_util_pct)) AS util_pct, round(avg(p.sm_active_pct)) AS sm_active_pct,
       round(avg(p.tensor_active_pct)) AS tensor_pct, round(avg(p.dram_active_pct)) AS dram_pct
FROM gpu_prof_samples p JOIN gpu_samples g USING (gpu_index, ts_ms)
WHERE p.ts_ms >= (unixepoch() - 3600) * 1000 GROUP BY p.gpu_index;""",
        "chart": {
            "mark": "bar",
            "x_column": "gpu_index",
            "x_type": "ordinal",
            "y_column": "sm_active_pct",
            "y_type": "quantitative",
        },
    },
    "hourly_gpu_utilisation": {
        "title": "Hourly GPU utilisation and peak power, last 7 days",
        "sql": """-- hourly GPU utilisation and peak power, last 7 days (rollup tier)
SELECT gpu_index, datetime(ts_ms / 1000, 'unixepoch', 'localtime') AS hour,
       round(gpu_util_pct_avg, 1) AS util_pct, round(power_mw_max / 1000.0) AS max_w
FROM gpu_samples_1h WHERE ts_ms >= (unixepoch() - 7 * 86400) * 1000 ORDER BY gpu_index, ts_ms;""",
        "chart": {
            "mark": "line",
            "x_column": "hour",
            "x_type": "temporal",
            "y_column": "util_pct",
            "y_type": "quantitative",
            "color_column": "gpu_index",
        },
    },
    "tokens_per_s_over_time": {
        "title": "Tokens/s of a run over time",
        "description": "run: a run id or name (its newest run). Loss and step time alongside; a "
        "long run is averaged into about 500 points.",
        "sql": """WITH r AS (SELECT run_id FROM runs WHERE run_id = :run OR name = :run
           ORDER BY run_id = :run DESC, started_ms DESC LIMIT 1),
     w AS (SELECT max(1, (max(step) - min(step)) / 500) AS steps FROM steps WHERE run_id = (SELECT run_id FROM r))
SELECT datetime(min(ts_ms) / 1000, 'unixepoch', 'localtime') AS time, min(step) AS step,
       round(avg(tokens_per_s), 1) AS tokens_per_s, avg(loss) AS loss, round(avg(step_time_ms), 2) AS step_time_ms
FROM steps WHERE run_id = (SELECT run_id FROM r)
GROUP BY step / (SELECT steps FROM w) ORDER BY step""",
        "chart": {
            "mark": "line",
            "x_column": "time",
            "x_type": "temporal",
            "y_column": "tokens_per_s",
            "y_type": "quantitative",
        },
    },
    "gpu_hours_per_user_per_day": {
        "title": "GPU-hours per user per day",
        "description": "days: how far back (default 30). A run counts its duration times its "
        "GPUs (the entries of gpu_uuids, else 1), on the day it started; the "
        "ranks a `gpuwatch run` wrapper joined count once, through the wrapper.",
        "sql": """SELECT date(started_ms / 1000, 'unixepoch', 'localtime') AS day, coalesce(user, uid) AS user,
       round(sum((coalesce(ended_ms, last_step_ms, unixepoch() * 1000) - started_ms)
                 * (CASE WHEN gpu_uuids IS NULL OR gpu_uuids = '' THEN 1
                    ELSE length(gpu_uuids) - length(replace(gpu_uuids, ',', '')) + 1 END))
             / 3600000.0, 2) AS gpu_hours
FROM runs
WHERE parent_run_id IS NULL
  AND started_ms >= (unixepoch() - coalesce(nullif(:days, ''), 30) * 86400) * 1000
GROUP BY day, user ORDER BY day, user""",
        "chart": {
            "mark": "bar",
            "x_column": "day",
            "x_type": "ordinal",
            "y_column": "gpu_hours",
            "y_type": "quantitative",
            "color_column": "user",
        },
    },
    "ooms_per_week": {
        "title": "OOMs per week",
        "description": "Runs that ended out of memory or left a postmortem, per ISO week (local time).",
        "sql": """WITH ooms AS (
  SELECT run_id, coalesce(ended_ms, started_ms) AS ts_ms FROM runs WHERE status = 'oom'
  UNION SELECT run_id, min(ts_ms) FROM oom_postmortems GROUP BY run_id)
SELECT strftime('%Y-W%W', ts_ms / 1000, 'unixepoch', 'localtime') AS week, count(*) AS ooms
FROM (SELECT run_id, min(ts_ms) AS ts_ms FROM ooms GROUP BY run_id)
GROUP BY week ORDER BY week""",
        "chart": {
            "mark": "bar",
            "x_column": "week",
            "x_type": "ordinal",
            "y_column": "ooms",
            "y_type": "quantitative",
        },
    },
    "alerts_per_day": {
        "title": "Alerts per day, by kind",
        "description": "Alerts written (one per incident), per day (local time) and kind.",
        "sql": """SELECT date(ts_ms / 1000, 'unixepoch', 'localtime') AS day, kind, count(*) AS alerts
FROM alerts WHERE ts_ms >= (unixepoch() - 30 * 86400) * 1000
GROUP BY day, kind ORDER BY day, kind""",
        "chart": {
            "mark": "bar",
            "x_column": "day",
            "x_type": "ordinal",
            "y_column": "alerts",
            "y_type": "quantitative",
            "color_column": "kind",
        },
    },
}


def chart_fragment(chart: dict[str, str]) -> str:
    """datasette-vega's settings as it keeps them in the URL fragment: g.mark=...&g.x_column=..."""
    return urlencode({f"g.{k}": v for k, v in chart.items()})


def metadata(db_name: str, table_columns: dict[str, list[str]]) -> dict[str, Any]:
    """Datasette metadata for database `db_name` whose tables/views have `table_columns`;
    tables not for people (storage internals, FTS shadows, bookkeeping) are hidden."""
    comments = schema_comments()
    tables: dict[str, dict[str, Any]] = {}
    for table, columns in table_columns.items():
        if table not in TABLES:
            tables[table] = {"hidden": True}
            continue
        described = {c: column_description(table, c, comments) for c in columns}
        tables[table] = {"description": TABLES[table], "columns": {c: d for c, d in described.items() if d}}
    queries = {name: {k: v for k, v in q.items() if k != "chart"} for name, q in QUERIES.items()}
    return {
        "title": "gpuwatch",
        "description": "The gpuwatch database, read-only. Times are ms since the Unix epoch, sizes "
        "bytes; units are in the column names and descriptions.",
        "databases": {db_name: {"tables": tables, "queries": queries}},
    }

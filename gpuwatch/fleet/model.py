"""The fleet at one instant, as frozen values, read from Prometheus in a few batched queries.

Hosts are the targets that export gpuwatch's series, named by their `Hostname` label; a target
whose scrape fails (`up` 0) stays listed with the time of its last stored sample. A multi-node
job is its job id: its ranks' series from every host sum to the job's tokens/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the TUI's Fleet screen imports these values; HTTP only where it is used
    from gpuwatch.fleet.prometheus import Prometheus

MIB = 1024 * 1024
# A host that stopped answering stays listed this long after its last scrape (beyond it `up`
# alone still lists it, named by its scrape address).
HOST_LOOKBACK = "1d"
GPU_VALUES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "gpuwatch_gpu_throttled",
)
RUN_METRICS = ("gpuwatch_run_tokens_per_second", "gpuwatch_run_step", "gpuwatch_run_peak_memory_bytes")
TARGET = "job, instance, Hostname"
# `max by` keeps only the labels the screen uses: the answer is a third of the raw series' size,
# and encoding it is most of what Prometheus spends on a refresh.
HOST_QUERIES = (
    f"last_over_time(gpuwatch_host_last_sample_timestamp_seconds[{HOST_LOOKBACK}])",
    "up",
)
GPU_QUERIES = HOST_QUERIES + (
    'max by (__name__, %s, gpu) ({__name__=~"%s"})' % (TARGET, "|".join(GPU_VALUES)),
    f"max by ({TARGET}, gpu, modelName, reason) (gpuwatch_gpu_up)",
    f"max by ({TARGET}, gpu, user) (gpuwatch_gpu_user_memory_bytes)",
)
JOB_QUERIES = HOST_QUERIES + ('{__name__=~"%s"}' % "|".join(RUN_METRICS),)


@dataclass(frozen=True)
class FleetHost:
    name: str  # the Hostname label, else the scrape address
    instance: str
    up: bool
    last_sample_s: float | None = None  # newest sample the host stored, as last scraped
    gpus: int = 0


@dataclass(frozen=True)
class FleetGpu:
    host: str
    index: int
    model: str = ""
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temp_c: float | None = None
    power_w: float | None = None
    state: str = "ok"  # ok | lost | throttled
    users: tuple[tuple[str, int], ...] = ()  # (user, bytes held), most first

    @property
    def mem_free_bytes(self) -> int | None:
        if self.mem_used_bytes is None or self.mem_total_bytes is None:
            return None
        return self.mem_total_bytes - self.mem_used_bytes


@dataclass(frozen=True)
class FleetRank:
    host: str
    rank: int | None
    run_id: str
    name: str
    user: str
    tokens_per_s: float | None = None
    step: int | None = None
    peak_bytes: int | None = None


@dataclass(frozen=True)
class FleetJob:
    job_id: str
    ranks: tuple[FleetRank, ...]

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens_per_s or 0.0 for r in self.ranks)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({r.host for r in self.ranks}))

    def share(self, rank: FleetRank) -> float | None:
        """This rank's part of the job's tokens/s (1/n each when all ranks are even)."""
        total = self.tokens_per_s
        return None if not total or rank.tokens_per_s is None else rank.tokens_per_s / total


@dataclass(frozen=True)
class Fleet:
    url: str
    at_s: float  # when Prometheus evaluated the queries
    hosts: tuple[FleetHost, ...] = ()
    gpus: tuple[FleetGpu, ...] = ()
    jobs: tuple[FleetJob, ...] = ()


def _target(metric: dict[str, str]) -> tuple[str, str]:
    return metric.get("job", ""), metric.get("instance", "")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def read_fleet(prom: Prometheus, jobs: bool = False) -> Fleet:
    """Every gpuwatch host and, as asked, its GPUs or the running jobs, as Prometheus holds them now."""
    if jobs:
        last, up, run_series = prom.query_many(list(JOB_QUERIES))
        gpu_series = []
    else:
        last, up, values, models, users = prom.query_many(list(GPU_QUERIES))
        gpu_series, run_series = values + models + users, []
    at_s = max((r["value"][0] for r in last + up), default=0.0)
    names = {
        _target(r["metric"]): r["metric"].get("Hostname") or r["metric"].get("instance", "?") for r in last
    }
    last_sample = {_target(r["metric"]): r["value"][1] for r in last}
    known_jobs = {job for job, _ in names}
    # A target lives in a job that has had gpuwatch series; others (Prometheus itself,
    # node exporters) are not ours. A host down for longer than HOST_LOOKBACK keeps its address.
    targets = {_target(r["metric"]): r["value"][1] == 1 for r in up if r["metric"].get("job") in known_jobs}
    gpus = _gpus(gpu_series, names, set(targets))
    counts: dict[str, int] = {}
    for g in gpus:
        counts[g.host] = counts.get(g.host, 0) + 1
    hosts = []
    for target, is_up in targets.items():
        name = names.get(target, target[1])
        hosts.append(FleetHost(name, target[1], is_up, last_sample.get(target), counts.get(name, 0)))
    hosts.sort(key=lambda h: h.name)
    return Fleet(prom.url, at_s, tuple(hosts), tuple(gpus), _jobs(run_series, names, set(targets)))


def _gpus(
    series: list[dict[str, Any]], names: dict[tuple[str, str], str], targets: set[tuple[str, str]]
) -> list[FleetGpu]:
    values: dict[tuple[str, str], dict[str, Any]] = {}
    for r in series:
        m = r["metric"]
        if _target(m) not in targets or "gpu" not in m:
            continue  # e.g. a dcgm-exporter on the same hosts: its series are not ours
        host = m.get("Hostname") or names.get(_target(m), m.get("instance", "?"))
        entry = values.setdefault((host, m["gpu"]), {"users": [], "model": ""})
        if "user" in m:
            entry["users"].append((m["user"], int(r["value"][1])))
        elif "modelName" in m:
            entry["model"] = m["modelName"]
            entry["gpuwatch_gpu_up"] = r["value"][1]
            entry["reason"] = m.get("reason", "")
        else:
            entry[m["__name__"]] = r["value"][1]
    gpus = []
    for (host, index), v in values.items():
        used, free = v.get("DCGM_FI_DEV_FB_USED"), v.get("DCGM_FI_DEV_FB_FREE")
        lost = v.get("gpuwatch_gpu_up") == 0
        state = (
            "not responding"
            if lost and v.get("reason") == "not responding"
            else "lost"
            if lost
            else "throttled"
            if v.get("gpuwatch_gpu_throttled") == 1
            else "ok"
        )
        gpus.append(
            FleetGpu(
                host=host,
                index=int(index),
                model=v["model"],
                util_pct=v.get("DCGM_FI_DEV_GPU_UTIL"),
                mem_used_bytes=None if used is None else round(used * MIB),
                mem_total_bytes=None if used is None or free is None else round((used + free) * MIB),
                temp_c=v.get("DCGM_FI_DEV_GPU_TEMP"),
                power_w=v.get("DCGM_FI_DEV_POWER_USAGE"),
                state=state,
                users=tuple(sorted(v["users"], key=lambda u: (-u[1], u[0]))),
            )
        )
    gpus.sort(key=lambda g: (g.host, g.index))
    return gpus


def _jobs(
    series: list[dict[str, Any]], names: dict[tuple[str, str], str], targets: set[tuple[str, str]]
) -> tuple[FleetJob, ...]:
    ranks: dict[tuple[str, str], dict[str, Any]] = {}  # (host, run_id) -> its values and labels
    for r in series:
        m = r["metric"]
        if _target(m) not in targets or "run_id" not in m:
            continue
        host = m.get("Hostname") or names.get(_target(m), m.get("instance", "?"))
        entry = ranks.setdefault((host, m["run_id"]), {"labels": m})
        entry[m["__name__"]] = r["value"][1]
    by_job: dict[str, list[FleetRank]] = {}
    for (host, run_id), v in ranks.items():
        m = v["labels"]
        step, peak = v.get("gpuwatch_run_step"), v.get("gpuwatch_run_peak_memory_bytes")
        by_job.setdefault(m.get("job_id") or run_id, []).append(
            FleetRank(
                host=host,
                rank=_int(m.get("rank")),
                run_id=run_id,
                name=m.get("name", ""),
                user=m.get("user", ""),
                tokens_per_s=v.get("gpuwatch_run_tokens_per_second"),
                step=None if step is None else int(step),
                peak_bytes=None if peak is None else int(peak),
            )
        )
    jobs = [
        FleetJob(job_id, tuple(sorted(rs, key=lambda r: (r.rank is None, r.rank or 0, r.host))))
        for job_id, rs in by_job.items()
    ]
    jobs.sort(key=lambda j: (-j.tokens_per_s, j.job_id))
    return tuple(jobs)

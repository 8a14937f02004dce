"""Alerts about GPUs, from what the sampler read this tick (no query): a process holding memory
on an idle GPU, a GPU lost or not responding, throttled for long (episodes), XID and ECC errors
(one alert each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from gpuwatch.alerts import texts
from gpuwatch.base import fmt
from gpuwatch.base.config import Config
from gpuwatch.store.alerts import Alert

if TYPE_CHECKING:
    from collectors.nvml import GpuProcessSample, GpuSample, GpuStatic, XidEvent
    from collectors.processes import ProcessInfo

MIB = 1024 * 1024
# NVML clock-event reason bits (nvml.h; their words in fmt.THROTTLE_REASONS): what counts as
# thermal throttling (HW slowdown, SW and HW thermal), and as power throttling (cap, brake).
THROTTLE_FAMILIES = (("thermal", 0x8 | 0x20 | 0x40), ("power", 0x4 | 0x80))


@dataclass(frozen=True)
class Fact:
    """A condition that holds this tick: `key` names it, `hold_ms` is how long it must last,
    `alert(since_ms, now_ms)` words it once it has."""

    key: str
    hold_ms: int
    alert: Callable[[int, int], Alert]


def _gpu_name(static: GpuStatic) -> str:
    known = ", ".join(filter(None, (static.name, static.uuid)))  # a GPU lost from the start has neither
    return f"GPU {static.gpu_index} ({known})" if known else f"GPU {static.gpu_index}"


def _gpu_key(static: GpuStatic) -> str:
    return static.uuid or f"index{static.gpu_index}"


def _idle_held(
    host: str,
    cfg: Config,
    static: GpuStatic,
    util: int,
    proc: GpuProcessSample,
    info: ProcessInfo,
    run_id: str | None,
) -> Fact:
    key = f"gpu.idle_held:{_gpu_key(static)}:{proc.pid}:{info.start_ms}"
    used = proc.used_mem_bytes
    whose = texts.whose(info.user, info.uid)
    command = fmt.clip(info.cmdline or "?", 200)

    def alert(since: int, now: int) -> Alert:
        held = fmt.duration(now - since)
        return Alert(
            kind="gpu.idle_held",
            incident=f"{key}@{since}",
            ts_ms=now,
            host=host,
            uid=info.uid,
            run_id=run_id,
            gpu_index=static.gpu_index,
            pid=proc.pid,
            title=f"GPU {static.gpu_index} on {host} held idle: {fmt.size(used)} by {whose}, "
            f"pid {proc.pid}, for {held}",
            body=texts.body(
                f"pid {proc.pid} of {whose} holds {fmt.size(used)} of {_gpu_name(static)} on {host}, "
                f"whose utilisation stayed at or below {cfg.idle_gpu_util_pct:g} % since {texts.when(since)} ({held}).",
                f"Command: {command}",
                f"Run: {run_id}" if run_id else None,
                "If it is no longer needed, end it to free the GPU for others.",
                more="gpuwatch status",
            ),
            detail={
                "used_mem_bytes": used,
                "gpu_util_pct": util,
                "since_ms": since,
                "held_ms": now - since,
                "uuid": static.uuid,
                "start_ms": info.start_ms,
                "command": command,
            },
        )

    return Fact(key, int(cfg.idle_gpu_minutes * 60_000), alert)


def _state_fact(host: str, cfg: Config, static: GpuStatic, state: str) -> Fact:
    kind = "gpu.lost" if state == "lost" else "gpu.not_responding"
    key = f"{kind}:{_gpu_key(static)}"
    what = (
        "is lost (fell off the bus or the driver gave up on it)"
        if state == "lost"
        else "is not responding (its NVML calls do not return)"
    )

    def alert(since: int, now: int) -> Alert:
        return Alert(
            kind=kind,
            incident=f"{key}@{since}",
            ts_ms=now,
            host=host,
            gpu_index=static.gpu_index,
            title=f"GPU {static.gpu_index} on {host} {what.split(' (')[0]}",
            body=texts.body(
                f"{_gpu_name(static)} on {host} {what} since {texts.when(since)}.",
                "Runs on it are likely stuck or failing; the host's kernel log (dmesg) may say why.",
                more="gpuwatch status",
            ),
            detail={"uuid": static.uuid, "since_ms": since},
        )

    hold = 0 if state == "lost" else int(cfg.hung_alert_seconds * 1000)
    return Fact(key, hold, alert)


def _throttle_fact(
    host: str, cfg: Config, static: GpuStatic, family: str, words: list[str], sample: GpuSample
) -> Fact:
    key = f"gpu.throttled:{_gpu_key(static)}:{family}"

    def alert(since: int, now: int) -> Alert:
        lasted = fmt.duration(now - since)
        return Alert(
            kind="gpu.throttled",
            incident=f"{key}@{since}",
            ts_ms=now,
            host=host,
            gpu_index=static.gpu_index,
            title=f"GPU {static.gpu_index} on {host} {family}-throttled for {lasted} ({', '.join(words)})",
            body=texts.body(
                f"{_gpu_name(static)} on {host} has been slowed by {family} limits ({', '.join(words)}) "
                f"since {texts.when(since)} ({lasted}).",
                f"Now: {fmt.MISSING if sample.temp_c is None else sample.temp_c} °C, "
                f"{fmt.MISSING if sample.power_mw is None else round(sample.power_mw / 1000)} W, "
                f"SM clock {fmt.MISSING if sample.sm_clock_mhz is None else sample.sm_clock_mhz} MHz.",
                more="gpuwatch status",
            ),
            detail={
                "uuid": static.uuid,
                "family": family,
                "reasons": sample.throttle_reasons,
                "temp_c": sample.temp_c,
                "power_mw": sample.power_mw,
                "since_ms": since,
            },
        )

    return Fact(key, int(cfg.throttle_alert_minutes * 60_000), alert)


def gpu_facts(
    host: str,
    cfg: Config,
    statics: Sequence[GpuStatic],
    samples: Sequence[GpuSample],
    procs: Sequence[GpuProcessSample],
    pid_facts: Mapping[int, tuple[Any, ...]],
) -> list[Fact]:
    """The conditions that hold this tick. `pid_facts`: pid -> (ProcessInfo, run_id, ...) of the
    GPU processes the sampler knows (the sampler's own cache)."""
    by_index = {s.gpu_index: s for s in samples}
    facts = []
    for static in statics:
        s = by_index.get(static.gpu_index)
        if s is None:  # read late while our process was busy: unknown this tick (unsampled())
            continue
        if s.state:
            facts.append(_state_fact(host, cfg, static, s.state))
            continue
        for family, bits in THROTTLE_FAMILIES:
            words = fmt.throttle_words((s.throttle_reasons or 0) & bits)
            if words:
                facts.append(_throttle_fact(host, cfg, static, family, words, s))
    min_bytes = cfg.idle_gpu_min_mib * MIB
    statics_by_index = {st.gpu_index: st for st in statics}
    for p in procs:
        s = by_index.get(p.gpu_index)
        if (
            s is None
            or s.state
            or s.gpu_util_pct is None
            or s.gpu_util_pct > cfg.idle_gpu_util_pct
            or p.used_mem_bytes is None
            or p.used_mem_bytes < min_bytes
        ):
            continue
        known = pid_facts.get(p.pid)
        if known is None or p.gpu_index not in statics_by_index:
            continue
        info: ProcessInfo = known[0]
        run_id: str | None = known[1]
        facts.append(_idle_held(host, cfg, statics_by_index[p.gpu_index], s.gpu_util_pct, p, info, run_id))
    return facts


def unsampled(statics: Sequence[GpuStatic], samples: Sequence[GpuSample]) -> set[str]:
    """The GPUs (as in episode keys) with no sample this tick: what held for them still holds."""
    sampled = {s.gpu_index for s in samples}
    return {_gpu_key(static) for static in statics if static.gpu_index not in sampled}


def key_gpu(key: str) -> str:
    """The GPU of a GPU episode's key ("gpu.throttled:UUID:thermal" -> "UUID")."""
    return key.split(":")[1]


class ErrorCounts:
    """XID events and ECC counts that rose: one alert each (sampler thread)."""

    def __init__(self) -> None:
        self.ecc: dict[str, int] = {}  # uuid -> uncorrected errors seen at the last tick

    def alerts(
        self,
        host: str,
        ts: int,
        statics: Sequence[GpuStatic],
        samples: Sequence[GpuSample],
        xids: Sequence[XidEvent],
    ) -> list[Alert]:
        by_index = {st.gpu_index: st for st in statics}
        found = []
        for x in xids:
            static = by_index.get(x.gpu_index)
            uuid = _gpu_key(static) if static else f"index{x.gpu_index}"
            where = _gpu_name(static) if static else "a GPU the driver could not name"
            found.append(
                Alert(
                    kind="gpu.xid",
                    incident=f"{uuid}:xid{x.xid}@{x.ts_ms}",
                    ts_ms=x.ts_ms,
                    host=host,
                    gpu_index=None if x.gpu_index < 0 else x.gpu_index,
                    title=f"GPU {x.gpu_index if x.gpu_index >= 0 else '?'} on {host}: XID {x.xid} error",
                    body=texts.body(
                        f"{where} on {host} reported critical XID error {x.xid} at {texts.when(x.ts_ms)}.",
                        "NVIDIA's XID catalogue says what it means; the kernel log has the driver's line.",
                        more="gpuwatch status",
                    ),
                    detail={"xid": x.xid, "uuid": uuid},
                )
            )
        for s in samples:
            static = by_index.get(s.gpu_index)
            if static is None or s.ecc_uncorrected is None:
                continue
            before = self.ecc.get(_gpu_key(static))
            self.ecc[_gpu_key(static)] = s.ecc_uncorrected
            if before is None or s.ecc_uncorrected <= before:
                continue  # the first reading is the baseline
            found.append(
                Alert(
                    kind="gpu.ecc",
                    incident=f"{_gpu_key(static)}:ecc{s.ecc_uncorrected}",
                    ts_ms=ts,
                    host=host,
                    gpu_index=s.gpu_index,
                    title=f"GPU {s.gpu_index} on {host}: {s.ecc_uncorrected - before} new uncorrectable ECC "
                    f"error(s)",
                    body=texts.body(
                        f"{_gpu_name(static)} on {host} counted {s.ecc_uncorrected - before} new "
                        f"uncorrectable ECC memory error(s) at {texts.when(ts)} "
                        f"({s.ecc_uncorrected} in all).",
                        "Work on it may have computed with corrupted memory; its memory may need a reset or RMA.",
                        more="gpuwatch status",
                    ),
                    detail={"uuid": static.uuid, "uncorrected": s.ecc_uncorrected, "before": before},
                )
            )
        return found

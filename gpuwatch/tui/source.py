"""The real data source: the store, read-only, turned into snapshots (runs in the poll thread).

Only the store's read side is used (`open_ro` + `queries`), so the TUI works for a user who
cannot write the database, while the daemon writes it and after it stopped.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from gpuwatch.analysis.step_split import PARTS, named_losses, split_of
from gpuwatch.base import fmt, spool
from gpuwatch.store import (
    SQLiteError,
    StoreError,
    alerts,
    health,
    now_ms,
    open_ro,
    postmortems,
    profiles,
    queries,
)
from gpuwatch.store.db import data_version
from gpuwatch.store.energy import EnergyLedger, RunEnergy
from gpuwatch.store.queries import PROCESS_TICK_SLACK_MS
from gpuwatch.tui.snapshot import (
    AlertRow,
    CapacityRow,
    Chart,
    GpuRow,
    HostRow,
    MigRow,
    OomRow,
    ProcessRow,
    ProfileRow,
    RunDetail,
    RunRow,
    Series,
    SlowRow,
    Snapshot,
    StacksRow,
    View,
)
from gpuwatch.tui.sparks import SPARK_SLOT_MS, SparkHistory, window_start

if TYPE_CHECKING:
    from sqlite3 import Connection

CHART_POINTS = 240  # per series; charts are at most ~160 columns x 2 dots
PROF_FRESH_MS = 60_000  # an older GPM sample says nothing of now: "n/a"
MAX_STEPS = 50_000  # newest steps read for a run chart; older ones are left out
WHY_EVERY_MS = 30_000  # a running run's slow phases are worked out again this often
OOM_TRACEBACK_LINES = 12  # the traceback's tail on the OOM screen
READ_CACHE_KIB = 256  # SQLite page cache of the TUI's one long-lived connection
STACK_FRAMES = 6  # innermost frames per thread in the run view's stacks panel
ALERTS_SHOWN = 200  # newest alerts on the Alerts screen
ALERT_LINE_MS = 3_600_000  # the top line tells of the alerts of the last hour
ALERT_LINE_LOOK = 50  # ... read from the newest this many (one seek on the rowid)


def run_row(r: queries.RunSummary) -> RunRow:
    return RunRow(
        r.run_id,
        r.name,
        r.user,
        r.status,
        r.started_ms,
        r.ended_ms,
        r.tokens_per_s_last,
        r.tokens_per_s_avg,
        r.peak_mem_bytes,
        r.oom,
        r.rank,
        r.world_size,
    )


def downsample(points: list[tuple[int, float]], n: int) -> tuple[tuple[int, float], ...]:
    """Average consecutive points into at most n, keeping the time of each bucket's first point."""
    if len(points) <= n:
        return tuple(points)
    out = []
    for b in range(n):
        chunk = points[b * len(points) // n : (b + 1) * len(points) // n]
        out.append((chunk[0][0], sum(v for _, v in chunk) / len(chunk)))
    return tuple(out)


def end_state(run: queries.Run) -> str:
    if run.status == "running":
        return ""
    parts = []
    if run.exit_code is not None:
        parts.append(f"exit {run.exit_code}")
    if run.signal is not None:
        parts.append(f"signal {run.signal}")
    if run.error_type or run.error_message:
        parts.append(": ".join(p for p in (run.error_type, run.error_message) if p))
    return " · ".join(parts)


def find_run(conn: Connection, run_ref: str | None) -> queries.Run | None:
    """The run a view names (queries.run), None if it names none or no such run."""
    if run_ref is None:
        return None
    try:
        return queries.run(conn, run_ref)
    except StoreError:
        return None


def oom_rows(conn: Connection, run_ref: str | None) -> tuple[OomRow, ...]:
    """A run's OOM postmortems as the OOM screen shows them; none for an unknown run."""
    run = find_run(conn, run_ref)
    if run is None:
        return ()
    rows = []
    for pm in postmortems.for_run(conn, run.run_id):
        neighbours = (
            None
            if pm.neighbours is None
            else tuple(
                (n.get("pid"), n.get("user"), n.get("used_mem_bytes"), n.get("run_id")) for n in pm.neighbours
            )
        )
        rows.append(
            OomRow(
                run_id=run.run_id,
                run_name=run.name,
                ts_ms=pm.ts_ms,
                kind=pm.kind,
                device=pm.device,
                requested_bytes=pm.requested_bytes,
                free_bytes=postmortems.headroom_bytes(asdict(pm)),
                total_bytes=pm.total_bytes,
                allocated_bytes=pm.allocated_bytes,
                reserved_bytes=pm.reserved_bytes,
                rss_bytes=pm.rss_bytes,
                cgroup_limit_bytes=pm.cgroup_limit_bytes,
                step=pm.step,
                seq_len=pm.seq_len,
                batch=pm.batch,
                phase=pm.phase,
                neighbours=neighbours,
                advice=tuple((a.get("title", ""), a.get("detail", "")) for a in pm.advice),
                blocks=tuple(
                    (b.get("size_bytes") or 0, (b.get("stack") or ["(no stack)"])[0])
                    for b in pm.largest_blocks
                ),
                traceback_tail=tuple((pm.traceback or "").rstrip().splitlines()[-OOM_TRACEBACK_LINES:]),
                snapshot_path=pm.snapshot_path,
            )
        )
    return tuple(rows)


def alert_rows(conn: Connection, limit: int = ALERTS_SHOWN) -> tuple[AlertRow, ...]:
    rows = []
    for a in alerts.recent(conn, limit):
        assert a.id is not None  # read back from the table: stored, so numbered
        rows.append(AlertRow(a.id, a.ts_ms, a.kind, a.title, a.body, a.run_id, a.gpu_index))
    return tuple(rows)


def alert_line(conn: Connection, now: int) -> str | None:
    """'2 alerts in the last hour · newest 21:40 run.failed: …', or None when there were none."""
    recent = [a for a in alerts.recent(conn, ALERT_LINE_LOOK) if a.ts_ms >= now - ALERT_LINE_MS]
    if not recent:
        return None
    n = f"{len(recent)}+" if len(recent) == ALERT_LINE_LOOK else str(len(recent))
    newest = recent[0]
    return (
        f"{n} alert{'s' if len(recent) > 1 else ''} in the last hour (a) · "
        f"{fmt.local_time(newest.ts_ms, with_date=False)} {newest.kind}: {newest.title}"
    )


def stacks_row(conn: Connection, run_id: str) -> StacksRow | None:
    """The newest stack dump, one line per thread: its innermost frames, innermost first."""
    dumps = profiles.stack_dumps(conn, run_id, limit=1)
    if not dumps:
        return None
    d = dumps[0]
    lines = []
    for thread in d.threads or ():
        frames = [
            f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"
            for f in (thread.get("frames") or [])[:STACK_FRAMES]
        ]
        state = "active" if thread.get("active") else "idle"
        lines.append(
            f"{thread.get('thread_name') or thread.get('os_thread_id')} ({state}): " + " < ".join(frames)
        )
    return StacksRow(d.ts_ms, d.pid, d.reason, "\n".join(lines), d.error)


def profile_row(conn: Connection, run_ref: str | None) -> ProfileRow | None:
    """A run's newest profile with its top operators; None for an unknown run or no profile."""
    run = find_run(conn, run_ref)
    if run is None:
        return None
    found = profiles.profiles(conn, run.run_id)
    if not found:
        return None
    p = found[0]
    ops = tuple(
        (
            o.name,
            o.calls,
            o.self_cpu_us,
            o.cpu_total_us,
            o.self_device_us,
            o.device_total_us,
            o.self_mem_bytes,
        )
        for o in profiles.profile_ops(conn, p.id)
    )
    breakdown = profiles.profile_breakdown(conn, p.id)
    return ProfileRow(
        run.run_id,
        run.name,
        p.id,
        p.ts_ms,
        p.trigger,
        p.first_step,
        p.steps,
        p.trace_path,
        p.trace_bytes,
        ops,
        len(found),
        None if breakdown is None else json.dumps(breakdown),
    )


def capacity_row(conn: Connection) -> CapacityRow | None:
    found = profiles.latest_capacity_study(conn)
    if found is None:
        return None
    study, points = found
    return CapacityRow(
        study.ts_ms,
        study.command,
        study.device,
        study.limit_bytes,
        study.margin,
        points=tuple(
            (
                pt.batch,
                pt.seq_len,
                pt.peak_bytes if pt.ok else None,
                study.fitted_bytes(pt.batch, pt.seq_len),
                pt.kind,
            )
            for pt in points
        ),
        predictions=tuple(
            (b, p["max_seq_len"], p.get("predicted_peak_bytes"), p.get("verified_peak_bytes"))
            for b, p in sorted(study.predicted.items())
        ),
    )


def with_migs(
    gpus: list[GpuRow], devices: list[queries.MigDevice], procs: tuple[ProcessRow, ...]
) -> tuple[GpuRow, ...]:
    """The GPUs, each with its MIG devices and the number of processes running on each."""
    if not devices:
        return tuple(gpus)
    on = Counter((p.gpu_index, p.gpu_instance_id, p.compute_instance_id) for p in procs)
    migs: dict[int, list[MigRow]] = {}
    for d in devices:
        migs.setdefault(d.gpu_index, []).append(
            MigRow(
                d.gpu_instance_id,
                d.compute_instance_id,
                d.profile,
                d.gpu_util_pct,
                d.mem_used_bytes,
                d.mem_total_bytes,
                on[d.gpu_index, d.gpu_instance_id, d.compute_instance_id],
            )
        )
    return tuple(replace(g, migs=tuple(migs.get(g.index, ()))) for g in gpus)


class StoreSource:
    def __init__(
        self,
        db_path: str,
        clock: Callable[[], int] = now_ms,
        stale_after_ms: int = 15_000,
        notice: str | None = None,
        spool_dirs: Sequence[Path] = (),
    ) -> None:
        """`stale_after_ms`: data older than this is shown as "daemon not running" (a few of
        its intervals); `notice`: a line shown while the data is live (no daemon: who samples);
        `spool_dirs`: where events may wait for the daemon (gpuwatch/base/spool.py)."""
        self.db_path = db_path
        self.spool_dirs = list(spool_dirs)
        self.clock = clock
        self.stale_after_ms = stale_after_ms
        self.notice = notice
        self.conn: Connection | None = None
        self.sparks = SparkHistory()
        # (what it was read for: view, data version, sparkline slot; the snapshot)
        self.last: tuple[tuple[View, int, int], Snapshot] | None = None
        self.energy: tuple[str, EnergyLedger] | None = None  # the Run screen's run, folded so far
        self.why: tuple[tuple[str, int], tuple[SlowRow, ...]] | None = (
            None  # (run, step period) -> slow phases
        )

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        self.sparks = SparkHistory()  # the file may be replaced before we reopen it
        self.last = None
        self.energy = None
        self.why = None

    def fetch(self, view: View) -> Snapshot:
        snap = replace(
            self._fetch(view),
            stale_after_ms=self.stale_after_ms,
            notice=self.notice,
            spooled=spool.waiting_line(self.spool_dirs) if self.spool_dirs else None,
        )
        trouble = health.read(self.db_path)  # the daemon cannot write: the banner says why
        return snap if trouble is None else replace(snap, problem=trouble.line())

    def _fetch(self, view: View) -> Snapshot:
        now = self.clock()
        try:
            if self.conn is None:
                # Each poll reads the newest pages of a few tables, which the OS caches anyway;
                # SQLite's default 2 MB page cache only let a TUI left open grow as the file did.
                self.conn = open_ro(self.db_path, cache_kib=READ_CACHE_KIB)
            conn = self.conn
            # Nothing committed since the last read of this view, and the sparklines' slot is the
            # same: that read stands (an idle store costs one pragma a poll, not a dozen queries).
            key = (view, data_version(conn), now // SPARK_SLOT_MS)
            if self.last is not None and self.last[0] == key:
                return replace(self.last[1], now_ms=now)
            snap = self._read(conn, view, now)
            self.last = key, snap
            return snap
        except (StoreError, SQLiteError) as e:
            self.close()  # reopen next poll: the file may appear or be replaced
            return Snapshot(now_ms=now, problem=str(e))

    def _read(self, conn: Connection, view: View, now: int) -> Snapshot:
        """`view` as the store has it now."""
        latest = queries.latest_gpu_samples(conn, now)
        base = self._freshness(conn, now, latest)
        if view.kind == "overview":
            return self._overview(conn, base, latest)
        if view.kind == "runs":
            return replace(
                base, runs=tuple(map(run_row, queries.runs(conn))), runs_total=queries.run_count(conn)
            )
        if view.kind == "run":
            return replace(base, detail=self._detail(conn, view, now))
        if view.kind == "oom":
            return replace(base, postmortems=oom_rows(conn, view.run_id))
        if view.kind == "profile":
            return replace(base, profile=profile_row(conn, view.run_id))
        if view.kind == "capacity":
            return replace(base, capacity=capacity_row(conn))
        if view.kind == "alerts":
            return replace(base, alerts=alert_rows(conn))
        raise ValueError(f"unknown view {view.kind!r}")

    def _freshness(self, conn: Connection, now: int, latest: dict[int, queries.GpuSample]) -> Snapshot:
        newest = [s.ts_ms for s in latest.values()]
        host = queries.latest_host_sample(conn, now)
        if host:
            newest.append(host.ts_ms)
        driver = bool(queries.gpus(conn))
        return Snapshot(
            now_ms=now,
            data_ms=max(newest) if newest else None,
            driver=driver,
            alert_line=alert_line(conn, now),
            host=None
            if host is None
            else HostRow(
                host.cpu_pct,
                host.load1,
                host.mem_used_bytes,
                host.mem_total_bytes,
                host.shm_used_bytes,
                host.shm_total_bytes,
            ),
        )

    def _overview(self, conn: Connection, base: Snapshot, latest: dict[int, queries.GpuSample]) -> Snapshot:
        infos = queries.gpus(conn)
        histories = self.sparks.update(conn, [info.gpu_index for info in infos], base.now_ms)
        first_slot = window_start(base.now_ms) // SPARK_SLOT_MS
        prof = queries.latest_gpu_prof_samples(conn, base.now_ms - PROF_FRESH_MS, base.now_ms)
        gpus = []
        for info in infos:
            s = latest.get(info.gpu_index)
            p = prof.get(info.gpu_index)
            history = histories[info.gpu_index]
            lost = info.state == "lost" or (s is not None and s.state == "lost")
            hung = s is not None and s.state == "hung"
            gpus.append(
                GpuRow(
                    index=info.gpu_index,
                    name=info.name or info.uuid,
                    state="lost" if lost else "hung" if hung else "ok",
                    state_since_ms=info.state_since_ms if hung else None,
                    util_pct=s.gpu_util_pct if s else None,
                    util_history=history,
                    util_history_slot=first_slot,
                    mem_used_bytes=s.mem_used_bytes if s else None,
                    mem_total_bytes=info.mem_total_bytes,
                    temp_c=s.temp_c if s else None,
                    power_mw=s.power_mw if s else None,
                    power_limit_mw=info.power_limit_mw,
                    throttle_reasons=s.throttle_reasons if s else None,
                    ecc_uncorrected=s.ecc_uncorrected if s else None,
                    sm_active_pct=p.sm_active_pct if p else None,
                    sm_occupancy_pct=p.sm_occupancy_pct if p else None,
                    tensor_active_pct=p.tensor_active_pct if p else None,
                    dram_active_pct=p.dram_active_pct if p else None,
                )
            )
        procs = tuple(
            ProcessRow(
                p.gpu_index,
                p.pid,
                p.uid,
                p.user,
                p.used_mem_bytes,
                p.sm_util_pct,
                p.cpu_pct,
                p.run_name,
                p.cmdline,
                p.gpu_instance_id,
                p.compute_instance_id,
            )
            for p in queries.gpu_processes(conn, base.now_ms)
        )
        return replace(
            base, gpus=with_migs(gpus, queries.mig_devices(conn, base.now_ms), procs), processes=procs
        )

    def _detail(self, conn: Connection, view: View, now: int) -> RunDetail | None:
        run = find_run(conn, view.run_id)
        if run is None:
            return None
        until = run.ended_ms or now
        since = run.started_ms if view.range_s is None else max(run.started_ms, until - view.range_s * 1000)
        summaries = queries.runs(conn)
        me = next((r for r in summaries if r.run_id == run.run_id), None)
        ranks = tuple(run_row(r) for r in summaries if run.job_id and r.job_id == run.job_id)
        steps = queries.steps(conn, run.run_id, since_ms=since, limit=MAX_STEPS)

        def series(label: str, unit: str, attr: str) -> Series:
            pts = [(s.ts_ms, float(getattr(s, attr))) for s in steps if getattr(s, attr) is not None]
            return Series(label, unit, downsample(pts, CHART_POINTS))

        memory = [
            series(label, "bytes", attr)
            for label, attr in (
                ("allocated", "mem_allocated_bytes"),
                ("reserved", "mem_reserved_bytes"),
                ("peak", "mem_peak_bytes"),
            )
        ]
        if not any(s.points for s in memory):  # a CPU run: the process's resident memory
            memory = [series("RSS", "bytes", "rss_bytes")]
        slow = self._slowdowns(conn, run.run_id, steps[-1].ts_ms if steps else None)
        shaded = tuple((r.start_ms, r.end_ms) for r in slow)
        charts = [Chart("tokens/s", (series("tokens/s", "per_s", "tokens_per_s"),), shaded)]
        loss = series("loss", "loss", "loss")
        named = named_losses(steps)  # several optimisers (a GAN's netD, netG): one line each
        if named:
            at = {s.step: s.ts_ms for s in steps}
            charts.append(
                Chart(
                    "loss",
                    tuple(
                        Series(name, "loss", downsample([(at[n], v) for n, v in points], CHART_POINTS))
                        for name, points in named.items()
                    ),
                )
            )
        elif loss.points:  # a run that records its loss (inference runs have none)
            charts.append(Chart("loss", (loss,)))
        charts.append(Chart("step time", (series("step", "ms", "step_time_ms"),), shaded))
        data_wait = series("waiting for data", "pct", "data_wait_pct")
        if data_wait.points:  # only runs whose compute start is marked (hooks, callbacks, mark_compute)
            charts.append(Chart("data wait (share of each step)", (data_wait,)))
        splits = [(s.ts_ms, split) for s, split in zip(steps, map(split_of, steps)) if split is not None]
        if splits:  # the zero-code hooks' split: data, compute, evaluation/checkpoint, other
            charts.append(
                Chart(
                    "where each step went (share)",
                    tuple(
                        Series(
                            part, "pct", downsample([(ts, split[part]) for ts, split in splits], CHART_POINTS)
                        )
                        for part in PARTS
                    ),
                )
            )
        charts.append(Chart("memory", tuple(memory)))
        by_uuid = {g.uuid: g.gpu_index for g in queries.gpus(conn)}
        for uuid in filter(None, (run.gpu_uuids or "").split(",")):
            index = by_uuid.get(uuid.strip())
            if index is None:
                continue
            util, mem = (
                tuple(
                    (p.ts_ms, p.avg)
                    for p in queries.gpu_series(conn, index, metric, since, until, CHART_POINTS)
                    if p.avg is not None
                )
                for metric in ("gpu_util_pct", "mem_used_bytes")
            )
            charts.append(Chart(f"GPU {index} utilisation", (Series("util", "pct", util),)))
            charts.append(Chart(f"GPU {index} memory", (Series("used", "bytes", mem),)))
        config = tuple(
            (str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in sorted(run.config.items())
        )
        row = (
            run_row(me)
            if me
            else RunRow(run.run_id, run.name, run.user, run.status, run.started_ms, run.ended_ms)
        )
        energy = self._energy(conn, run, until)
        tokens = None if energy is None else queries.run_tokens(conn, run.run_id, energy.from_ms, until)
        return RunDetail(
            run=row,
            host=run.host,
            pid=run.pid,
            command=run.command,
            job_id=run.job_id,
            end_state=end_state(run),
            ranks=ranks,
            config=config,
            charts=tuple(charts),
            since_ms=since,
            stacks=stacks_row(conn, run.run_id),
            profiles=len(profiles.profiles(conn, run.run_id)),
            energy_j=None if energy is None else energy.joules,
            energy_complete=energy is None or energy.complete,
            joules_per_token=energy.joules / tokens if energy is not None and tokens else None,
            slowdowns=slow,
        )

    def _slowdowns(self, conn: Connection, run_id: str, newest_ms: int | None) -> tuple[SlowRow, ...]:
        """The run's slow phases (gpuwatch why), worked out again only when its newest step
        moved on by WHY_EVERY_MS: the analysis reads every step, a poll should not."""
        if newest_ms is None:
            return ()
        key = (run_id, newest_ms // WHY_EVERY_MS)
        if self.why is None or self.why[0] != key:
            from gpuwatch.analysis.why import analyse

            result = analyse(conn, run_id)
            self.why = (
                key,
                tuple(
                    SlowRow(
                        s.start_ms,
                        s.end_ms,
                        s.first_step,
                        s.last_step,
                        s.slower_pct,
                        result.unit,
                        tuple(f"{c.share_pct:.0f} % {c.kind}: {c.detail}" for c in s.causes),
                    )
                    for s in result.slowdowns
                ),
            )
        return self.why[1]

    def _energy(self, conn: Connection, run: queries.Run, until_ms: int) -> RunEnergy | None:
        """The run's energy so far: the first poll folds its lifetime, later ones only what is new."""
        if self.energy is None or self.energy[0] != run.run_id:
            self.energy = run.run_id, EnergyLedger(run.started_ms - PROCESS_TICK_SLACK_MS)
        ledger = self.energy[1]
        ledger.fold(conn, until_ms + 1, runs=[run.run_id])
        return ledger.energy(run.run_id, run.started_ms)

"""Alerts about runs: finished, failed, OOM, lost (one each, when the run ends), stalled and
recovered (a pair per stall episode), slow (tokens/s far below the run's own median)."""

from __future__ import annotations

import json
import logging
import signal
import statistics
from typing import TYPE_CHECKING

from gpuwatch.alerts import texts
from gpuwatch.alerts.episodes import Episodes, incident
from gpuwatch.alerts.stalled_runs import Stalled
from gpuwatch.analysis.postmortem_text import figure_lines
from gpuwatch.base import fmt
from gpuwatch.base.config import Config
from gpuwatch.store import alert_runs, postmortems
from gpuwatch.store.alerts import Alert, recoveries
from gpuwatch.store.queries import run_by_id
from gpuwatch.store.running import running_runs

if TYPE_CHECKING:
    import sqlite3

    from gpuwatch.store.postmortems import Postmortem

log = logging.getLogger(__name__)

STACK_FRAMES = 3  # innermost frames of the stalled thread an alert quotes
SLOW_ROWS = 2000  # newest step rows a slowness check reads: its window, then the median's
SLOW_MIN_BASELINE = 10  # rows before the window needed to call a median the run's own


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _oom_postmortem(conn: sqlite3.Connection, run_id: str) -> Postmortem | None:
    """The run's newest OOM postmortem, or its ranks' (`gpuwatch run` children) when it has none."""
    found = postmortems.for_run(conn, run_id)
    if not found:
        for child in alert_runs.rank_run_ids(conn, run_id):
            found += postmortems.for_run(conn, child)
    return max(found, key=lambda pm: pm.ts_ms) if found else None


def ended_alert(conn: sqlite3.Connection, run_id: str) -> Alert | None:
    """The alert for a run that ended (finished, failed, oom, killed, lost); None while running."""
    r = run_by_id(conn, run_id)
    if r is None or r.status == "running":
        return None
    label = texts.run_label(r.name, run_id)
    ended = r.ended_ms or r.started_ms
    whose = texts.whose(r.user, r.uid)
    took = f"after {texts.lasted(r.started_ms, ended)}"
    error = ": ".join(filter(None, (r.error_type, r.error_message))) or None
    status = r.status
    detail: dict[str, object] = {
        k: getattr(r, k)
        for k in ("status", "exit_code", "signal", "error_type", "started_ms", "ended_ms")
        if getattr(r, k) is not None
    }
    more = f"gpuwatch show {run_id}"
    oom_killed = status == "killed" and r.error_type == "OOMKilled"
    if status == "finished":
        kind, what, headline = "run.finished", "finished", f"finished {took}"
    elif status == "oom" or oom_killed:
        kind, what, more = "run.oom", "ran out of memory", f"gpuwatch oom {run_id}"
        pm = _oom_postmortem(conn, run_id)
        if pm is not None:
            headline = f"out of {pm.kind.upper()} memory: " + " ".join(figure_lines(pm)[0].split())
            advice = pm.advice[0].get("title") if pm.advice else None
            detail.update(
                postmortem_id=pm.id,
                requested_bytes=pm.requested_bytes,
                free_bytes=pm.free_bytes,
                total_bytes=pm.total_bytes,
                step=pm.step,
                phase=pm.phase,
            )
            error = f"Advice: {advice}" if advice else None
        else:
            headline = "killed by the kernel's OOM killer" if oom_killed else "ran out of memory"
    elif status == "lost":
        kind, what = "run.lost", "was lost"
        headline = "was lost: its process is gone and it never reported an end (killed, or its host rebooted)"
    else:  # failed, or killed by a signal
        kind = "run.failed"
        if r.signal:
            what = f"was killed by {_signal_name(r.signal)}"
        elif r.exit_code is not None:
            what = f"failed with exit status {r.exit_code}"
        else:
            what = "failed"
        headline = f"{what} {took}"
    title = f"{label} {what} on {r.host} ({whose})"
    body = texts.body(
        f"{label} of {whose} on {r.host} {headline}.",
        error,
        f"Started {texts.when(r.started_ms)}, ended {texts.when(ended)} ({texts.lasted(r.started_ms, ended)}).",
        more=more,
    )
    return Alert(
        kind=kind,
        incident=run_id,
        ts_ms=ended,
        host=r.host or "",
        title=title,
        body=body,
        uid=r.uid,
        run_id=run_id,
        detail=detail,
    )


class RunEnds:
    """Runs of this host that ended since the last pass: those no longer running, and those that
    started and ended between two passes. The first pass looks back `lookback_ms` (runs that
    ended while no rules ran: the alert is written once, its (kind, incident) is unique)."""

    def __init__(self, host: str, lookback_ms: int = 6 * 3_600_000):
        self.host = host
        self.lookback_ms = lookback_ms
        self.running: set[str] | None = None
        self.quick_seen: set[str] = set()
        self.last_ms = 0

    def ended(self, conn: sqlite3.Connection, now: int) -> list[str]:
        # a wrapper's ranks: its own run's end speaks for them
        running = {r.run_id for r in running_runs(conn, self.host) if r.parent_run_id is None}
        if self.running is None:
            ended = set(alert_runs.ended_since(conn, self.host, now - self.lookback_ms))
            quick: set[str] = set()
        else:
            quick = set(alert_runs.started_and_ended_since(conn, self.host, self.last_ms - 60_000))
            ended = (self.running - running) | (quick - self.quick_seen)
        self.running, self.quick_seen, self.last_ms = running, quick, now
        return sorted(ended)


def _top_frames(stacks_json: str | None) -> list[str]:
    """The innermost frames of the main thread (where a training loop runs; else the one that was
    running, else the first), innermost first."""
    try:
        threads = json.loads(stacks_json) if stacks_json else []
    except ValueError:
        return []
    if not threads:
        return []
    thread = next((t for t in threads if t.get("thread_name") == "MainThread"), None) or next(
        (t for t in threads if t.get("active")), threads[0]
    )
    return [
        f"{f.get('name')} ({f.get('short_filename') or f.get('filename')}:{f.get('line')})"
        for f in (thread.get("frames") or [])[:STACK_FRAMES]
    ]


def stalled_alert(
    conn: sqlite3.Connection, stalled: Stalled, stacks_json: str | None = None, dump_error: str | None = None
) -> Alert | None:
    r = run_by_id(conn, stalled.run_id)
    if r is None:
        return None
    label = texts.run_label(r.name, stalled.run_id)
    whose = texts.whose(r.user, r.uid)
    frames = _top_frames(stacks_json)
    silent = fmt.duration(stalled.silent_s * 1000)
    stack = (
        ("Stack (innermost first): " + " < ".join(frames))
        if frames
        else (f"No stack: {dump_error}" if dump_error else None)
    )
    ts = stalled.last_step_ms + int(stalled.threshold_s * 1000)
    return Alert(
        kind="run.stalled",
        incident=incident(stalled.run_id, stalled.last_step_ms),
        ts_ms=ts,
        host=r.host or "",
        uid=r.uid,
        run_id=stalled.run_id,
        pid=stalled.pid,
        title=f"{label} stalled on {r.host} ({whose}): no step for {silent}",
        body=texts.body(
            f"{label} of {whose} on {r.host} has not stepped since {texts.when(stalled.last_step_ms)} "
            f"({silent}; its threshold is {fmt.duration(stalled.threshold_s * 1000)}); pid {stalled.pid} is alive.",
            stack,
            more=f"gpuwatch stacks {stalled.run_id}",
        ),
        detail={
            "last_step_ms": stalled.last_step_ms,
            "silent_s": round(stalled.silent_s, 1),
            "threshold_s": round(stalled.threshold_s, 1),
            "frames": frames,
        },
    )


def recovered_alerts(conn: sqlite3.Connection, host: str) -> list[Alert]:
    """run.recovered for each stalled run that stepped again: the pair of its run.stalled."""
    found = []
    for r in recoveries(conn, host):
        label = texts.run_label(r.name, r.run_id)
        whose = texts.whose(r.user, r.uid)
        gap = fmt.duration(r.last_step_ms - r.stalled_ms)
        found.append(
            Alert(
                kind="run.recovered",
                incident=r.incident,
                ts_ms=r.last_step_ms,
                host=host,
                uid=r.uid,
                run_id=r.run_id,
                title=f"{label} recovered on {host} ({whose}): stepping again after {gap}",
                body=texts.body(
                    f"{label} of {whose} on {host} stepped again at {texts.when(r.last_step_ms)}, "
                    f"{gap} after the step before its stall.",
                    more=f"gpuwatch show {r.run_id}",
                ),
                detail={"stalled_since_ms": r.stalled_ms, "stepped_ms": r.last_step_ms},
            )
        )
    return found


def slow_cause(conn: sqlite3.Connection, run_id: str, since_ms: int, until_ms: int) -> str | None:
    """The top cause of a run's slowdown over [since_ms, until_ms], as `gpuwatch why` ranks it
    (its GPUs, the host, other processes, the run itself), as a line; None when unknown. The
    analysis is loaded only when a run.slow fires, never by the daemon's start."""
    from gpuwatch.analysis.why import top_cause

    try:
        cause = top_cause(conn, run_id, since_ms, until_ms)
    except Exception:  # an alert without its cause beats no alert
        log.debug("no cause for run %s's slowdown", run_id, exc_info=True)
        return None
    if cause is None:
        return None
    return f"{cause.kind} ({cause.share_pct:.0f} % of it): {cause.detail}"


def slow_alerts(
    conn: sqlite3.Connection, cfg: Config, host: str, now: int, episodes: Episodes
) -> list[Alert]:
    """run.slow: every step row of the last slow_alert_minutes below slow_alert_pct % of the
    median tokens/s of the run's rows before that window (up to SLOW_ROWS rows in all)."""
    window_ms = int(cfg.slow_alert_minutes * 60_000)
    found: list[Alert] = []
    holding: set[str] = set()
    for run in running_runs(conn, host):
        if run.last_step_ms is None or run.last_step_ms < now - window_ms:
            continue  # no step in the window to judge
        run_id, name, uid, user = run.run_id, run.name, run.uid, run.user
        rates = alert_runs.recent_rates(conn, run_id, now - window_ms, SLOW_ROWS)
        window, before = rates.since, rates.before
        if not window or len(before) < SLOW_MIN_BASELINE:
            continue
        median = statistics.median(before)
        if median <= 0 or max(window) >= cfg.slow_alert_pct / 100 * median:
            continue
        key = f"run.slow:{run_id}"
        holding.add(key)
        since = episodes.hold(conn, key, now, 0)
        if since is None:
            continue
        now_rate = statistics.median(window)
        label = texts.run_label(name, run_id)
        whose = texts.whose(user, uid)
        cause = slow_cause(conn, run_id, now - window_ms, now)
        found.append(
            Alert(
                kind="run.slow",
                incident=incident(key, since),
                ts_ms=now,
                host=host,
                uid=uid,
                run_id=run_id,
                title=f"{label} slowed down on {host} ({whose}): {now_rate:,.0f} tokens/s, "
                f"{100 * now_rate / median:.0f} % of its median",
                body=texts.body(
                    f"{label} of {whose} on {host} ran at {now_rate:,.0f} tokens/s (median) over the last "
                    f"{fmt.duration(window_ms)}, below {cfg.slow_alert_pct:g} % of its own median of "
                    f"{median:,.0f} tokens/s before that.",
                    f"Likely cause: {cause}" if cause else None,
                    more=f"gpuwatch show {run_id}",
                ),
                detail={
                    "tokens_per_s": round(now_rate, 1),
                    "median_tokens_per_s": round(median, 1),
                    "window_ms": window_ms,
                    "pct": cfg.slow_alert_pct,
                    "cause": cause,
                },
            )
        )
    episodes.release_others(conn, "run.slow:", holding)
    return found

"""Alerts about the host: the database's filesystem running out of space (disk.low), and the
`gpuwatch notify when-free` wishes that `gpuwatch pick`'s rules now grant (gpus.free)."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from gpuwatch.alerts import texts
from gpuwatch.alerts.episodes import Episodes, incident
from gpuwatch.base import fmt
from gpuwatch.base.config import Config
from gpuwatch.store import alert_wishes
from gpuwatch.store.alert_wishes import add_wish as add_wish  # where ingest and the CLI look for it
from gpuwatch.store.alerts import Alert

if TYPE_CHECKING:
    import sqlite3

    from gpuwatch.fleet.pick import Candidate


def disk_low_alert(
    conn: sqlite3.Connection, cfg: Config, host: str, now: int, episodes: Episodes
) -> Alert | None:
    """disk.low once per episode of the database's filesystem below disk_low_pct % free."""
    directory = os.path.dirname(os.path.abspath(cfg.db_path))
    try:
        usage = shutil.disk_usage(directory)
    except OSError:
        return None
    key = f"disk.low:{os.stat(directory).st_dev}"
    free_pct = 100.0 * usage.free / usage.total if usage.total else 100.0
    if free_pct >= cfg.disk_low_pct:
        episodes.release(conn, key)
        return None
    since = episodes.hold(conn, key, now, 0)
    if since is None:
        return None
    return Alert(
        kind="disk.low",
        incident=incident(key, since),
        ts_ms=now,
        host=host,
        title=f"Disk low on {host}: {fmt.size(usage.free)} free ({free_pct:.1f} %) where gpuwatch keeps its database",
        body=texts.body(
            f"The filesystem of {directory} on {host} has {fmt.size(usage.free)} free of "
            f"{fmt.size(usage.total)} ({free_pct:.1f} %, below {cfg.disk_low_pct:g} %) at {texts.when(now)}.",
            "When it fills, gpuwatch stops recording samples and runs' checkpoints may fail to save.",
            more="gpuwatch doctor",
        ),
        detail={
            "path": directory,
            "free_bytes": usage.free,
            "total_bytes": usage.total,
            "free_pct": round(free_pct, 2),
            "threshold_pct": cfg.disk_low_pct,
        },
    )


def granted_alerts(conn: sqlite3.Connection, host: str, now: int) -> list[Alert]:
    """gpus.free for each wish `gpuwatch pick` would grant now; a granted wish is forgotten."""
    pending = alert_wishes.wishes(conn, host)
    if not pending:
        return []
    from gpuwatch.fleet.pick import NothingFits, choose, local_candidates  # (urllib: only when wished)

    found: list[Alert] = []
    candidates: dict[float, list[Candidate]] = {}  # by window: one read of the samples per window length
    for w in pending:
        if w.window_min not in candidates:
            candidates[w.window_min] = local_candidates(conn, now - int(w.window_min * 60_000))
        try:
            [best, *_] = choose(
                candidates[w.window_min], w.gpus, w.min_free_bytes, w.max_util_pct, w.user or str(w.uid)
            )
        except NothingFits:
            continue
        indices = ",".join(str(c.index) for c in best)
        alert_wishes.forget(conn, w.id)
        found.append(
            Alert(
                kind="gpus.free",
                incident=f"wish{w.id}@{w.created_ms}",
                ts_ms=now,
                host=host,
                uid=w.uid,
                title=f"{w.gpus} GPU(s) free on {host} for {texts.whose(w.user, w.uid)}: CUDA_VISIBLE_DEVICES={indices}",
                body=texts.body(
                    f"GPU(s) {indices} on {host} have kept at least {fmt.size(w.min_free_bytes)} free at "
                    f"≤ {w.max_util_pct:g} % utilisation over the last {w.window_min:g} minutes, as asked at "
                    f"{texts.when(w.created_ms)} (`gpuwatch notify when-free -n {w.gpus}`).",
                    "Free now, not reserved: someone else may take them. The wish is now forgotten.",
                    more=f"gpuwatch pick -n {w.gpus} --mem {w.min_free_bytes // 2**20}MiB",
                ),
                detail={
                    "wish_id": w.id,
                    "gpus": [c.index for c in best],
                    "asked_ms": w.created_ms,
                    "min_free_bytes": w.min_free_bytes,
                    "max_util_pct": w.max_util_pct,
                },
            )
        )
    return found

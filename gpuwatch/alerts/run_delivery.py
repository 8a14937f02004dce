"""`gpuwatch run` where no daemon delivers (none at all, or a system daemon without the notify
service): the wrapper itself delivers the run's alerts (and any other pending alerts of the
user's saved subscriptions) once the run has ended."""

from __future__ import annotations

import time
from pathlib import Path

from gpuwatch.alerts.deliver import Deliverer
from gpuwatch.alerts.subscriptions import END_KINDS
from gpuwatch.store import StoreError, open_ro
from gpuwatch.store.alerts import any_for_run

END_ALERT_WAIT_S = 10.0  # for the rules to turn the run's end into its alert
DELIVERY_WAIT_S = 75.0  # a few retries, the last after the 60 s back-off cap


def _end_alerted(db_path: Path, run_id: str) -> bool:
    try:
        conn = open_ro(db_path)
    except StoreError:
        return False
    try:
        return any_for_run(conn, run_id, END_KINDS)
    finally:
        conn.close()


def deliver_after_run(
    store_path: Path,
    db_path: Path,
    run_id: str,
    group_s: float,
    end_wait_s: float = END_ALERT_WAIT_S,
    wait_s: float = DELIVERY_WAIT_S,
    terminals_uid: int | None = None,
) -> int:
    """Deliver until nothing is pending or `wait_s` passed; the deliveries still pending (kept:
    the next `gpuwatch run` or a `gpuwatch daemon --user` sends them). Nothing to do when a
    user daemon works the store: it delivers them."""
    deliverer = Deliverer(store_path, db_path, group_s, terminals_uid=terminals_uid)
    try:
        if not deliverer.owns_store():
            return 0
        deadline = time.monotonic() + end_wait_s
        while not _end_alerted(db_path, run_id) and time.monotonic() < deadline:
            time.sleep(0.2)
        deadline = time.monotonic() + wait_s
        while True:
            deliverer.deliver_once()
            left = deliverer.pending()
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.5)
    finally:
        deliverer.close()

"""Who receives what: the alert kinds a subscription may ask for, which alerts it matches, and
what its owner may see of it. The subscriptions themselves live in a private file
(gpuwatch/store/subscriptions.py): every URL is a secret. A subscription only ever matches alerts
whose uid is its owner's; admin-wide ones (uid NULL, from the root-only file) match GPU and host
alerts and every user's gpu.idle_held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuwatch.alerts import GPU_KINDS, KINDS, RUN_KINDS
from gpuwatch.alerts.redact import redact
from gpuwatch.store import deliveries
from gpuwatch.store import subscriptions as stored
from gpuwatch.store.subscriptions import Subscription

# Where the daemon and the CLI catch it.
from gpuwatch.store.subscriptions import SubscriptionError as SubscriptionError

if TYPE_CHECKING:
    import sqlite3

    from gpuwatch.store.alerts import Alert

# The kinds that end a run: a `run --notify` subscription is done once one is delivered.
END_KINDS = ("run.finished", "run.failed", "run.oom", "run.lost")
# What an admin-wide subscription may receive (a run's own alerts are its owner's business).
ADMIN_KINDS = GPU_KINDS + ("disk.low",)
DEFAULT_KINDS = RUN_KINDS


def public(sub: Subscription) -> dict[str, Any]:
    """What its owner may be shown: everything but the URL itself."""
    return {
        "id": sub.id,
        "url": redact(sub.url),
        "on": list(sub.kinds),
        "run": sub.run_name,
        "run_id": sub.run_id,
        "admin": sub.uid is None,
        "uid": sub.uid,
        "transient": sub.transient,
        "created_ms": sub.created_ms,
    }


def matches(sub: Subscription, alert: Alert, run_name: str | None) -> bool:
    if alert.id is None or alert.id <= sub.after_alert_id or alert.kind not in sub.kinds:
        return False
    if sub.uid is None:
        return alert.uid is None or alert.kind == "gpu.idle_held"
    if alert.uid != sub.uid:
        return False
    if sub.run_id and alert.run_id != sub.run_id:
        return False
    return not sub.run_name or run_name == sub.run_name


def parse_kinds(
    text: str | None, allowed: tuple[str, ...] = KINDS, default: tuple[str, ...] = DEFAULT_KINDS
) -> tuple[str, ...]:
    """'run.failed,run.oom' or 'run.*' -> the kinds; an unknown one is an error naming it."""
    if not text:
        return tuple(default)
    kinds: list[str] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        chosen = (
            [k for k in allowed if k.startswith(word[:-1])]
            if word.endswith("*")
            else [word]
            if word in allowed
            else []
        )
        if not chosen:
            raise SubscriptionError(f"unknown alert kind {word!r} (kinds: {', '.join(allowed)})")
        kinds += [k for k in chosen if k not in kinds]
    return tuple(kinds)


def mine(conn: sqlite3.Connection, sub_id: int, uid: int | None) -> Subscription:
    """Subscription `sub_id` if `uid` owns it (None: root, any); else the same error as for a
    missing one, so another user's ids cannot be probed."""
    sub = stored.get(conn, sub_id)
    if sub is None or (uid is not None and sub.uid != uid):
        raise SubscriptionError(f"no subscription {sub_id} of yours (see `gpuwatch notify list`)")
    return sub


def remove(conn: sqlite3.Connection, sub_id: int, uid: int | None) -> Subscription:
    sub = mine(conn, sub_id, uid)
    stored.remove(conn, sub_id)
    return sub


def deliveries_of(
    conn: sqlite3.Connection, alert_ids: list[int], uid: int | None
) -> dict[int, list[dict[str, Any]]]:
    """{alert id: [{sub, url (redacted), state, attempts, sent_ms}]} for `uid`'s subscriptions
    (None: root, all of them)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for d in deliveries.of_alerts(conn, alert_ids, uid):
        out.setdefault(d.alert_id, []).append(
            {
                "sub": d.sub_id,
                "url": redact(d.url),
                "state": d.state,
                "attempts": d.attempts,
                "sent_ms": d.sent_ms,
            }
        )
    return out

"""The words every alert shares: who, where, when, and the command that shows more."""

from __future__ import annotations

import time

from gpuwatch.base import fmt


def when(ts_ms: int) -> str:
    """'2026-12-04 21:40:03 UTC': an alert is read elsewhere, so it names its time zone."""
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts_ms / 1000))


def whose(user: str | None, uid: int | None) -> str:
    if uid is None:
        return user or "unknown user"
    return f"{user} (uid {uid})" if user else f"uid {uid}"


def run_label(name: str | None, run_id: str) -> str:
    return f"run {name} ({run_id})" if name else f"run {run_id}"


def lasted(start_ms: int | None, end_ms: int) -> str:
    return fmt.duration(end_ms - start_ms) if start_ms is not None else fmt.MISSING


def body(*lines: str | None, more: str) -> str:
    """The lines that have something to say, then 'More: <command>'."""
    return "\n".join([*(line for line in lines if line), f"More: {more}"])

"""Is a pid still the process we knew? Pids are reused: a run's process is alive only if the
process now holding its pid started no later than the run did."""

from __future__ import annotations

import psutil

START_SLACK_MS = 2000


def process_alive(pid: int, started_ms: int) -> bool:
    """True if `pid` is still the process that started the run at `started_ms`."""
    try:
        created_ms = int(psutil.Process(pid).create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.Error:
        return True  # exists but unreadable (e.g. hidepid): not evidence that it is gone
    return created_ms <= started_ms + START_SLACK_MS

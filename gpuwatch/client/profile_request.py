"""Ask a live run to profile its next steps, and wait for the profile to land.

`gpuwatch profile` and the TUI's Run screen (P) both ask through here: the run is looked up in
the database the caller reads, the daemon passes the request to the run's process (checking
that the asker may control it), and the profile shows up in that database once recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuwatch.base.config import Config
from gpuwatch.client.link import RequestError, daemon_request
from gpuwatch.store import now_ms, open_ro, profiles, queries

POLL_S = 0.5


@dataclass(frozen=True)
class ProfileAsked:
    """A request the daemon passed on to the run."""

    run_id: str
    steps: int
    asked_ms: int

    @property
    def line(self) -> str:
        return f"asked run {self.run_id} to profile its next {self.steps} steps"


def ask(cfg: Config, db_path: str, run: str, steps: int) -> ProfileAsked:
    """Ask RUN (id, name or id prefix in the database at `db_path`) to profile its next
    `steps` steps. Raises RequestError (NoDaemon with no daemon) or StoreError, one line each."""
    conn = open_ro(db_path)
    try:
        target = queries.run(conn, run)
    finally:
        conn.close()
    if target.status != "running":
        raise RequestError(f"run {target.run_id} is {target.status}, not running")
    asked = now_ms()
    reply = daemon_request(
        cfg,
        {"type": "control_request", "run_id": target.run_id, "action": "profile", "steps": steps},
        "profiling",
    )
    if reply.get("type") != "control_result":
        raise RequestError(str(reply.get("error", reply)))
    return ProfileAsked(target.run_id, steps, asked)


def wait(db_path: str, asked: ProfileAsked, timeout_s: float) -> profiles.Profile | None:
    """The profile `asked` brought, once stored; None if none came within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    conn = open_ro(db_path)
    try:
        while not (found := profiles.profiles(conn, asked.run_id, since_ms=asked.asked_ms)):
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)
        return found[0]
    finally:
        conn.close()

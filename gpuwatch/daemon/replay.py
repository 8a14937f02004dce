"""One adopted spool file stored by a process of its own, at a lower CPU priority.

The daemon's GPU readers are Python threads: any CPU-bound thread in the daemon's process
(decoding and validating a million spooled events, building their rows) takes the interpreter
from them for milliseconds at a time, and a 10 Hz sampler gives a GPU 50 ms. So SpoolAdopter
(spool.py) checks the file and its owner, then hands the open file to this process, which
validates the events and writes them in transactions of MAX_EVENTS_PER_BATCH events with its
own connection (SQLite's WAL lock keeps writers apart; each transaction is short), pausing
after each as long as it took. It prints one JSON line: what it stored, refused and skipped.

    python -m gpuwatch.daemon.replay FD DB UID USER PID
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from gpuwatch import protocol
from gpuwatch.store import StoreError, open_rw
from gpuwatch.store.events import Peer, apply_events_committed

if TYPE_CHECKING:
    from sqlite3 import Connection

BUSY_SHARE = 0.5  # at most this share of the time writing, the rest paused
NICE = 19  # the lowest: a replay can wait, the GPU readers cannot


def replay(f: IO[bytes], conn: Connection, peer: Peer) -> dict[str, Any]:
    """Store the events of the open file `f` a batch at a time; `complete` False if the
    database refused a batch (the file stays and is replayed whole later: idempotent)."""
    stored = unreadable = refused = 0
    first_refused = ""
    while True:
        started = time.monotonic()
        events = []
        for line in f:
            if not line.strip():
                continue
            try:
                events.append(protocol.validate_event(json.loads(line))[0])
            except (ValueError, protocol.ProtocolError):
                unreadable += 1  # e.g. the last line of a process killed mid-write
            if len(events) >= protocol.MAX_EVENTS_PER_BATCH:
                break
        if not events:
            return {
                "complete": True,
                "stored": stored,
                "refused": refused,
                "first_refused": first_refused,
                "unreadable": unreadable,
            }
        try:
            outcome = apply_events_committed(conn, events, peer)
        except StoreError as e:
            return {"complete": False, "stored": stored, "error": str(e)}
        stored += len(outcome.applied)
        refused += len(outcome.rejected)
        if outcome.rejected and not first_refused:
            first_refused = outcome.rejected[0][2]
        busy = time.monotonic() - started
        time.sleep(busy * (1 - BUSY_SHARE) / BUSY_SHARE)


def main(argv: list[str]) -> int:
    fd, db, uid, user, pid = int(argv[0]), argv[1], int(argv[2]), argv[3], int(argv[4])
    os.nice(NICE)
    try:
        conn = open_rw(db)
    except StoreError as e:
        print(json.dumps({"complete": False, "stored": 0, "error": str(e)}), flush=True)
        return 0
    with open(fd, "rb") as f:
        result = replay(f, conn, Peer(uid, user, pid, "daemon"))
    conn.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

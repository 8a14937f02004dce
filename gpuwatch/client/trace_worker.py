"""`python -m gpuwatch.client.trace_worker TRACE`: the breakdown of one profile window's trace,
worked out at low priority in a process of its own and printed as one line of JSON.

Reading a trace is pure Python (a 50 MB trace is about 5 s of it): inside the training process
it would hold the GIL the training loop needs, so profiling.Profiling starts this instead and
sends what it prints. `analysed_by` (pid, nice, seconds) says where and how it ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_STORED_STEPS = 200  # per-step figures kept with a breakdown


def breakdown_of(path: Path) -> dict[str, Any]:
    """The stored breakdown of one profile window: its rank of `gpuwatch trace`, with the advice."""
    from gpuwatch.analysis.trace import analyse_files

    result = analyse_files([path])
    rank = result["ranks"][0]
    rank["steps"] = rank["steps"][-MAX_STORED_STEPS:]
    return {**rank, "advice": result["advice"]}


def main(trace: str) -> None:
    from gpuwatch.client.helpers import lower_priority

    lower_priority()
    try:  # CPU-bound batch work: never preempt the training process when it wakes
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        pass
    started = time.monotonic()
    breakdown = breakdown_of(Path(trace))
    breakdown["analysed_by"] = {
        "pid": os.getpid(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "seconds": round(time.monotonic() - started, 3),
    }
    sys.stdout.write(json.dumps(breakdown, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])

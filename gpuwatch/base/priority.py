"""Lower the CPU priority of one of our threads: Linux keeps a nice value per thread, so our
bookkeeping (spool replays, a wrapper's transport) can yield the CPU to the work that matters
(the training, the GPU readers) without slowing that down."""

from __future__ import annotations

import os
import threading


def lower_thread(increment: int = 10, tid: int | None = None) -> None:
    """Raise the nice value of thread `tid` (default: the calling thread) by `increment`, up to 19."""
    tid = threading.get_native_id() if tid is None else tid
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError:  # a thread that just ended, or no per-thread priorities here
        pass

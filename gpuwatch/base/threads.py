"""gpuwatch's threads inside a program's own process leave the process's signals to the program.

The kernel hands a signal sent to a process (`kill PID`, Ctrl-C) to any of its threads that does
not block it, and a Python handler runs in the main thread only. When one of our threads takes a
SIGTERM, the main thread is not woken from the call it is blocked in (a sleep, a wait for a
batch): a tracked program would die, or see its KeyboardInterrupt, only once that call returned.
"""

from __future__ import annotations

import signal
import threading

# Every signal but the faults a thread causes itself (and the two no thread can block).
_PROCESS_SIGNALS = signal.valid_signals() - {
    signal.SIGSEGV,
    signal.SIGBUS,
    signal.SIGFPE,
    signal.SIGILL,
    signal.SIGABRT,
    signal.SIGTRAP,
    signal.SIGSYS,
    signal.SIGKILL,
    signal.SIGSTOP,
}


def start(thread: threading.Thread) -> threading.Thread:
    """Start `thread` with the process's signals blocked in it (a thread inherits its creator's
    mask; the creator's own is put back at once, and a signal that came meanwhile is only held
    until then)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _PROCESS_SIGNALS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return thread

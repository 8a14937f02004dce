"""Logging for journald: one line per record on stderr, no timestamp, a <N> syslog priority prefix.

journald reads the prefix as the priority (SyslogLevelPrefix=yes is the default) and adds
its own timestamp, so neither belongs in the message.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Hashable, TextIO

_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        text = record.getMessage()
        if record.exc_info:
            # A traceback stays one record: journald would split lines into separate entries.
            text += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return f"<{priority}>{record.name}: {text}".replace("\n", " ")


def setup(level: int = logging.INFO, stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JournalFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class Throttle:
    """Log a recurring message at most once per period for each key, with how many were held back.

    A key that keeps firing waits twice as long each time (up to `max_period_s`): a sustained
    attack costs a few lines an hour, not sixty per error code. A key quiet for a whole period
    starts over at `period_s`."""

    def __init__(
        self,
        logger: logging.Logger,
        period_s: float = 60.0,
        max_period_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.period_s = period_s
        self.max_period_s = max_period_s
        self.clock = clock
        self._keys: dict[Hashable, list[float]] = {}  # key -> [last logged, current period, held back since]

    def log(self, key: Hashable, level: int, msg: str, *args: object, exc_info: Any = None) -> bool:
        """Log now, or count it for the next line of this key; True if it was logged."""
        now = self.clock()
        state = self._keys.get(key)
        if state is not None and now - state[0] < state[1]:
            state[2] += 1
            return False
        if state is None or now - state[0] >= 2 * state[1]:  # quiet for a period: start over
            state = self._keys[key] = [now, self.period_s, 0]
        else:
            state[1] = min(2 * state[1], self.max_period_s)
        held, state[0], state[2] = state[2], now, 0
        if held:
            msg += " (%d more since the last such line)"
            args += (held,)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

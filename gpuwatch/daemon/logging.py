"""Logging for journald: one line per record on stderr, no timestamp, a <N> syslog priority prefix.

journald reads the prefix as the priority (SyslogLevelPrefix=yes is the default) and adds
its own timestamp, so neither belongs in the message.
"""

from __future__ import annotations

import logging
import sys

_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
             logging.DEBUG: 7}


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6)
        text = record.getMessage()
        if record.exc_info:
            # A traceback stays one record: journald would split lines into separate entries.
            text += " | " + self.formatException(record.exc_info).replace("\n", " | ")
        return f"<{priority}>{record.name}: {text}".replace("\n", " ")


def setup(level: int = logging.INFO, stream=None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JournalFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)

"""Our log lines on a program's stderr say they are ours: `gpuwatch run`'s wrapper and the helper
that records a `track()` or `autolog()` with no daemon share the program's terminal."""

from __future__ import annotations

import logging
import sys


class _OurLine(logging.Formatter):
    """The wrapper's stderr is the program's too: each line we log there says it is ours."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return line if line.startswith("gpuwatch:") else "gpuwatch: " + line


def prefix_our_log_lines() -> None:
    """Warnings of the sampler, collectors and store we run beside a program begin with
    `gpuwatch:` on stderr, like the hooks' own lines in the program."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OurLine("%(message)s"))
    handler.setLevel(logging.WARNING)
    for name in ("gpuwatch", "collectors"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.propagate = False

"""sqlite-utils' Database over one of our connections, imported without pandas and numpy.

A module of its own, below db.py and search.py alike, so the store's modules import one another
without a circle."""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from typing import Any, Iterator


@contextlib.contextmanager
def sqlite_utils_database(conn: sqlite3.Connection) -> Iterator[Any]:
    """sqlite-utils' Database over `conn`, its connection settings left alone.

    Importing sqlite-utils imports pandas and numpy when they are installed, only to map their
    column types, which gpuwatch never hands it: 80 MB more in a daemon that migrated a database
    once. They are hidden while it imports; and when it was our import, it is forgotten after,
    so a program under `gpuwatch run` that imports sqlite-utils itself gets the usual one."""
    ours = "sqlite_utils" not in sys.modules
    hidden = [m for m in ("pandas", "numpy") if ours and m not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import fails: sqlite-utils goes on without them
    try:
        import sqlite_utils
    finally:
        for name in hidden:
            sys.modules.pop(name, None)
    try:
        yield sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
    finally:
        if ours:
            for name in [m for m in sys.modules if m.split(".")[0] in ("sqlite_utils", "sqlite_fts4")]:
                del sys.modules[name]

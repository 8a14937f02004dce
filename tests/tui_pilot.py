"""What the TUI's pilot tests share: a fixed time zone and running async tests."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Rendered times are in UTC, so snapshots do not depend on the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def pilot_test(fn):
    """Run an async pilot test without an async pytest plugin (none is a dependency)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        asyncio.run(fn(*args, **kwargs))

    return wrapper

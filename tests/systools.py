"""Markers for tests that need a system tool (tmux, prometheus, systemd-analyze)."""

from __future__ import annotations

import os
import shutil
import time

import pytest


def needs_tools(*names: str):
    """Skip where a tool is missing on a developer's machine; never in CI (CI=true), where
    .ci/run installs them and a skip would hide a broken install step: there the test runs
    and fails."""
    missing = [name for name in names if shutil.which(name) is None]
    return pytest.mark.skipif(
        bool(missing) and not os.environ.get("CI"), reason=f"needs {', '.join(missing)} (.ci/run installs it)"
    )


def wait_for(predicate, timeout=30.0):
    """The first truthy value of predicate(), polled every 50 ms; fails after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# The one line `gpuwatch run`'s wrapper writes on a host without GPUs (ours, so it says so).
NO_GPU_LINE = "gpuwatch: no GPUs to sample, host only:"

"""Shared test set-up: every test gets private XDG dirs and no GPUWATCH_* settings from outside."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # lets tests and bench/ import fake_pynvml
# One torch thread per process, as torchrun gives each rank: the suite runs torch programs side
# by side on few cores, where each one's OpenMP pool would spin waiting for cores the others hold
# (about a tenth of the suite's CPU). Programs run plain and under gpuwatch get the same.
os.environ["OMP_NUM_THREADS"] = "1"


def _nvidia_driver_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def _seconds(item) -> float:
    """About how long a test takes on two quiet cores: a `slow` mark's own figure, else 8 s for
    a `slow` test and half a second for any other."""
    mark = item.get_closest_marker("slow")
    if mark is None:
        return 0.5
    return float(mark.args[0]) if mark.args else 8.0


def _longest_modules_first(items) -> None:
    """The test files in decreasing order of their tests' seconds, each file's own order kept.
    `bash dev.sh test` hands out whole files (xdist's loadscope, in this order): the longest
    start first and the shortest fill in at the end, so no core waits on one late long file,
    and a file's module fixtures are set up once."""
    totals: dict[str, float] = {}
    for item in items:
        totals[item.nodeid.split("::")[0]] = totals.get(item.nodeid.split("::")[0], 0.0) + _seconds(item)
    rank = {path: n for n, path in enumerate(sorted(totals, key=lambda path: -totals[path]))}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: a file's order stays


def pytest_collection_modifyitems(config, items):
    _longest_modules_first(items)
    if any("gpu" in item.keywords for item in items) and not _nvidia_driver_present():
        skip = pytest.mark.skip(reason="needs a real NVIDIA GPU and driver (none here)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Point every per-user path at tmp_path so tests never read or write the real home."""
    for name in list(os.environ):
        if name.startswith("GPUWATCH_"):
            monkeypatch.delenv(name)
    # Short runtime dir: Unix socket paths are limited to 107 bytes.
    runtime = Path(f"/tmp/gw-rt-{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}")
    runtime.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GPUWATCH_CONFIG", str(tmp_path / "config" / "gpuwatch.toml"))
    yield tmp_path
    shutil.rmtree(runtime, ignore_errors=True)

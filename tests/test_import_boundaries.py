"""Headless parts must not drag in torch or textual: each is imported in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "textual", "datasette")  # datasette: only behind `gpuwatch browse`

# Daemon, store, protocol, client and CLI: torch and textual only inside the functions that need them.
HEADLESS = [
    "gpuwatch",
    "gpuwatch.daemon.main",
    "gpuwatch.daemon.ingest",
    "gpuwatch.daemon.metrics",
    "gpuwatch.monitor.sampler",
    "gpuwatch.alerts.rules",
    "gpuwatch.monitor.scheduler",
    "gpuwatch.store",
    "gpuwatch.store.queries",
    "gpuwatch.store.maintenance",
    "gpuwatch.store.energy",
    "gpuwatch.analysis.loss",
    "gpuwatch.analysis.why",
    "gpuwatch.analysis.why.versus",
    "gpuwatch.cli.why_cmd",
    "gpuwatch.cli.charts",
    "gpuwatch.protocol",
    "gpuwatch.client",
    "gpuwatch.client.profile_request",  # what the TUI loads to ask for a profile
    "gpuwatch.client.supervise",
    "gpuwatch.integrations.autohook",  # loaded only once the program imported torch, but imports none itself
    "gpuwatch.integrations.accounting",
    "gpuwatch.cli",
    "gpuwatch.cli.daemon_cmd",
    "gpuwatch.cli.status_cmd",
    "gpuwatch.cli.query_cmd",
    "gpuwatch.cli.service_cmd",
    "gpuwatch.cli.selftest_cmd",
    "gpuwatch.selftest.cuda",  # torch only inside the CUDA checks
    "gpuwatch.cli.pick_cmd",
    "gpuwatch.alerts.deliver",  # alert delivery runs in the user daemon and the notify service
    "gpuwatch.alerts.server",
    "gpuwatch.cli.notify_cmd",
    "gpuwatch.fleet.prometheus",
    "gpuwatch.fleet.model",
    "gpuwatch.fleet.pick",
    "collectors.nvml",
    "collectors.host",
    "collectors.processes",
]


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def heavy_after(code: str) -> list[str]:
    """Run `code` in a fresh interpreter; return which heavy modules it left loaded."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", [m for m in HEADLESS if _module_exists(m)])
def test_import_loads_neither_torch_nor_textual(module):
    assert heavy_after(f"import {module}") == []


def test_the_core_modules_exist():
    # The list above skips modules not written yet; these must always be there.
    for module in ("gpuwatch.daemon.main", "gpuwatch.store", "gpuwatch.cli", "gpuwatch.monitor.sampler"):
        assert _module_exists(module), module


def test_the_tui_and_the_export_leave_datasette_out():
    code = "import gpuwatch.tui.app, gpuwatch.tui.web, gpuwatch.analysis.runfile, gpuwatch.cli.browse_cmd"
    assert "datasette" not in heavy_after(code)


@pytest.mark.parametrize(
    "args",
    [["--help"], ["status", "--help"], ["daemon", "--help"], ["query", "--help"], ["browse", "--help"]],
)
def test_cli_help_loads_neither(args):
    code = (
        "from gpuwatch.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code"
    )
    assert heavy_after(code) == []


def test_the_import_contracts_of_the_architecture_hold():
    # The table of parts as import-linter contracts (pyproject.toml): what each part may never
    # import, including through function-level imports, which the runtime checks above miss.
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout

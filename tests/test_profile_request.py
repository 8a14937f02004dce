"""Asking a live run for a profile: `gpuwatch profile` and the TUI's Run screen (P) ask the same
way, through a real ingest server on a real socket, and the run's connection gets the request."""

from __future__ import annotations

import asyncio
import subprocess
import time

from click.testing import CliRunner
from test_ingest import Client, events, run_start, server, shared_dir  # noqa: F401 (fixtures)

from gpuwatch.cli import main


def _live_run(server):  # noqa: F811 (the fixture)
    """A workload connection that started run r1: where the daemon sends r1's control."""
    workload = Client(server.cfg.socket_path)
    assert workload.rt(events(run_start(name="train.py")))["type"] == "ack"
    return workload


def test_the_tui_asks_for_a_profile_without_starting_a_process(server, monkeypatch):  # noqa: F811
    from gpuwatch.tui.app import GpuwatchApp
    from gpuwatch.tui.screens.run import PROFILE_STEPS, RunScreen
    from gpuwatch.tui.source import StoreSource

    workload = _live_run(server)
    monkeypatch.setenv("GPUWATCH_SOCKET", str(server.cfg.socket_path))

    def no_process(*args, **kwargs):
        raise AssertionError(f"the TUI started a process: {args}")

    async def drive():
        app = GpuwatchApp(StoreSource(str(server.cfg.db_path)), refresh_s=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            app.push_screen(RunScreen("r1"))
            await pilot.pause(0.2)
            await pilot.press("P")
            deadline = time.monotonic() + 30
            while not any("p shows it when it lands" in str(n.message) for n in app._notifications):
                assert time.monotonic() < deadline, [n.message for n in app._notifications]
                await pilot.pause(0.1)
            return [str(n.message) for n in app._notifications]

    with monkeypatch.context() as patched:  # undone before the fixtures' own clean-up runs rm
        patched.setattr(subprocess, "run", no_process)
        patched.setattr(subprocess, "Popen", no_process)
        said = asyncio.run(drive())
    assert f"asked run r1 to profile its next {PROFILE_STEPS} steps; p shows it when it lands" in said
    assert workload.read() == {
        "v": 1,
        "type": "control",
        "run_id": "r1",
        "action": "profile",
        "steps": PROFILE_STEPS,
    }
    workload.close()


def test_gpuwatch_profile_asks_the_run_and_says_so(server, monkeypatch):  # noqa: F811
    workload = _live_run(server)
    monkeypatch.setenv("GPUWATCH_SOCKET", str(server.cfg.socket_path))
    db = str(server.cfg.db_path)
    asked = CliRunner().invoke(main, ["profile", "train.py", "--steps", "4", "--wait", "0", "--db", db])
    assert asked.exit_code == 0, asked.output
    assert asked.stderr == "asked run r1 to profile its next 4 steps\n" and asked.stdout == ""
    assert workload.read() == {"v": 1, "type": "control", "run_id": "r1", "action": "profile", "steps": 4}

    waited = CliRunner().invoke(main, ["profile", "r1", "--wait", "0.5", "--db", db])
    assert waited.exit_code == 1
    assert waited.stderr.splitlines()[-1] == (
        "Error: no profile from run r1 within 0.5s (slow steps? it will still land; see --show)"
    )
    workload.close()


def test_gpuwatch_profile_of_an_ended_run_is_one_line(server, monkeypatch):  # noqa: F811
    workload = _live_run(server)
    end = {"id": "end-r1", "kind": "run_end", "run_id": "r1", "ts_ms": 5000, "status": "finished"}
    assert workload.rt(events(end))["type"] == "ack"
    monkeypatch.setenv("GPUWATCH_SOCKET", str(server.cfg.socket_path))
    result = CliRunner().invoke(main, ["profile", "r1", "--db", str(server.cfg.db_path)])
    assert result.exit_code == 1
    assert result.stderr == "Error: run r1 is finished, not running\n"
    workload.close()

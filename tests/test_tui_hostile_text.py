"""Any user on the server names runs, writes command lines and run configs: text that looks like
Rich or Textual markup is shown as it is, on every screen, and never stops the TUI. ("[/x]" is
a closing tag with no opening one, which markup parsing rejects with an exception.)"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from tui_pilot import pilot_test, utc  # noqa: F401 (utc: an autouse fixture)

from gpuwatch.tui.app import GpuwatchApp
from gpuwatch.tui.snapshot import GpuRow, OomRow, ProcessRow, ProfileRow, RunDetail, RunRow, Snapshot, View

NOW = 1_764_676_800_000
GiB = 2**30
HOSTILE = "[/x][b]y[/b][memory]"  # a closing tag alone, a bold tag, and torch's "[memory]" op


def hostile(label: str) -> str:
    return f"{label}{HOSTILE}"


RUN = RunRow("r-1", hostile("run"), hostile("user"), "oom", NOW - 60_000, NOW, None, 1000.0, GiB, True, 0, 2)


class HostileSource:
    def fetch(self, view: View) -> Snapshot:
        base = Snapshot(now_ms=NOW, data_ms=NOW - 1000, driver=True)
        if view.kind == "overview":
            return replace(
                base,
                gpus=(
                    GpuRow(
                        index=0, name=hostile("g"), util_pct=50, mem_used_bytes=GiB, mem_total_bytes=80 * GiB
                    ),
                ),
                processes=(
                    ProcessRow(
                        0,
                        os.getpid(),
                        os.getuid(),
                        hostile("user"),
                        GiB,
                        10,
                        1.0,
                        hostile("run"),
                        hostile("cmd"),
                    ),
                ),
            )
        if view.kind == "runs":
            return replace(base, runs=(RUN,))
        if view.kind == "run":
            return replace(
                base,
                detail=RunDetail(
                    run=RUN,
                    host=hostile("host"),
                    pid=1,
                    command=hostile("cmd"),
                    job_id=hostile("job"),
                    end_state=hostile("end"),
                    ranks=(RUN,),
                    config=((hostile("key"), hostile("value")),),
                    since_ms=RUN.started_ms,
                ),
            )
        if view.kind == "oom":
            return replace(
                base,
                postmortems=(
                    OomRow(
                        run_id="r-1",
                        run_name=hostile("run"),
                        ts_ms=NOW,
                        kind="gpu",
                        device=0,
                        phase=hostile("phase"),
                        neighbours=((1, hostile("user"), GiB, hostile("run")),),
                        advice=((hostile("title"), hostile("detail")),),
                        blocks=((GiB, hostile("frame")),),
                        traceback_tail=(hostile("tb"),),
                    ),
                ),
            )
        if view.kind == "profile":
            return replace(
                base,
                profile=ProfileRow(
                    "r-1",
                    hostile("run"),
                    1,
                    NOW,
                    hostile("trigger"),
                    1,
                    2,
                    None,
                    None,
                    ops=((hostile("op"), 1, 1.0, 1.0, 1.0, 1.0, 1),),
                ),
            )
        raise AssertionError(view)

    def close(self) -> None:
        pass


def screen_text(app) -> str:
    """The screen's characters (the SVG export's text, its tags and entities undone)."""
    svg = app.export_screenshot()
    text = re.sub(r"<[^>]+>", "", svg).replace("&#160;", " ")
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").replace("&#x27;", "'")


async def shows(app, pilot, *labels: str) -> None:
    await pilot.pause(0.3)
    text = screen_text(app)
    for label in labels:
        assert hostile(label) in text, (label, type(app.screen).__name__)


@pilot_test
async def test_markup_in_names_commands_and_configs_is_shown_as_written_everywhere():
    app = GpuwatchApp(HostileSource(), refresh_s=0.05)
    async with app.run_test(size=(200, 50)) as pilot:
        await shows(app, pilot, "g", "user", "run", "cmd")  # overview and its process table
        await pilot.press("k")  # the signal confirmation
        await shows(app, pilot, "user", "cmd", "run")
        await pilot.press("escape", "r")
        await shows(app, pilot, "run", "user")  # runs
        await pilot.press("enter")
        await shows(app, pilot, "run", "user", "host", "cmd", "key", "value")  # one run
        await pilot.press("O")
        await shows(app, pilot, "run", "user", "title", "detail", "frame", "tb")  # its OOM postmortem
        await pilot.press("escape", "p")
        await shows(app, pilot, "run", "op")  # its profile
        assert app.is_running

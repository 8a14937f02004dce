"""The overview's screen written plainly in Textual (Static.update, DataTable.update_cell), with
no store, no CLI and no gpuwatch code: bench_tui's reference for what Textual itself costs at
this content.

A clock, 8 GPU lines whose figures change every second, a 50-row process table whose SM% and
CPU% change every 5 s (DataTable.update_cell), a Footer; the terminal's ANSI colours, as
gpuwatch uses. Run by bench_tui in a pty: `python bench/textual_plain.py`.
"""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.widgets import DataTable, Footer, Static

GPUS, PROCESSES, PROCESS_EVERY_S = 8, 50, 5


class PlainApp(App):
    BINDINGS = [
        ("q", "quit", "Quit"),
        ("r", "noop", "Runs"),
        ("o", "noop", "OOMs"),
        ("question_mark", "noop", "Help"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.ticks = 0

    def compose(self) -> ComposeResult:
        yield Static(id="clock")
        yield from (Static(id=f"gpu{k}") for k in range(GPUS))
        yield Static("GPU processes")
        yield DataTable(cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        self.theme = "ansi-dark"
        table = self.query_one(DataTable)
        for name in ("GPU", "PID", "USER", "MEM", "SM%", "CPU%", "COMMAND"):
            table.add_column(name, key=name)
        for k in range(PROCESSES):
            table.add_row(
                str(k % GPUS),
                str(10_000 + k),
                "alice",
                f"{(k + 1) / 4:.1f}G",
                "0",
                "0",
                "python train.py --seq-len 32768",
                key=str(k),
            )
        self.tick()
        self.set_interval(1, self.tick)

    def tick(self) -> None:
        self.ticks += 1
        self.query_one("#clock", Static).update(f"live · updated {time.strftime('%H:%M:%S')}")
        for k in range(GPUS):
            util = (self.ticks * 7 + k * 13) % 100
            self.query_one(f"#gpu{k}", Static).update(
                f"{k:>3} {'█' * (util // 10):<10} {util:>3}% {40 + k}.0G/80.0G {55 + self.ticks % 5}°C "
                f"{300 + self.ticks % 50}W/700W ok"
            )
        if self.ticks % PROCESS_EVERY_S == 0:
            table = self.query_one(DataTable)
            for k in range(PROCESSES):
                table.update_cell(str(k), "SM%", str((k + self.ticks) % 100))
                table.update_cell(str(k), "CPU%", str((k * self.ticks) % 300))


if __name__ == "__main__":
    PlainApp().run()

"""Modal screens: help and the signal confirmation. The poller pauses while one is open."""

from __future__ import annotations

import signal

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gpuwatch.base import fmt
from gpuwatch.tui.snapshot import ProcessRow

HELP = """\
[b]gpuwatch tui[/b] — keys

[b]everywhere[/b]    o overview · r runs · C capacity study · ? help · q quit
[b]overview[/b]      s sort column · S reverse · / user filter · m only mine
              k signal the selected process · Esc clear filter
              (click a column header to sort by it)
[b]alerts[/b]        a opens it · ↑↓ select: its full text and the command for more
[b]runs[/b]          Enter open run · f status filter · / user filter · m only mine
[b]run[/b]           1 last 5 min · 2 last hour · 3 last 24 h · 0 whole run
              p newest profile · P profile the next steps now · Esc back
[b]profile[/b]       s sort by the next column · Esc back
[b]fleet[/b]         F opens it · j GPUs / jobs · s sort · f only free
              / user or host filter · Enter the ssh command for the host

Long ranges read the per-minute and per-hour rollups, so they stay fast.
Data comes from the gpuwatch store, read-only; nothing here writes it.
"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(HELP)
            yield Static("[dim]Esc / ? closes[/dim]")


class ConfirmSignal(ModalScreen[int | None]):
    """Asks which signal to send to one process; dismisses with the signal number or None."""

    BINDINGS = [
        Binding("t", "choose('SIGTERM')", "SIGTERM"),
        Binding("i", "choose('SIGINT')", "SIGINT"),
        Binding("K", "choose('SIGKILL')", "SIGKILL"),
        Binding("escape,n", "choose('')", "Cancel"),
    ]

    def __init__(self, proc: ProcessRow) -> None:
        super().__init__()
        self.proc = proc

    def compose(self) -> ComposeResult:
        p = self.proc
        with Vertical(id="dialog"):
            # Built as a Text: the command line and run name are the user's, never markup.
            yield Static(
                Text.assemble(
                    (f"Send a signal to pid {p.pid}", "bold"),
                    f" ({p.user or p.uid}) on GPU {p.gpu_index}?\n"
                    f"{(p.cmdline or '')[:200]}\nGPU memory {fmt.size(p.used_mem_bytes)}"
                    f"{'  · run ' + p.run_name if p.run_name else ''}",
                )
            )
            with Horizontal(id="buttons"):
                yield Button("SIGTERM (t)", id="SIGTERM", variant="warning")
                yield Button("SIGINT (i)", id="SIGINT")
                yield Button("SIGKILL (K)", id="SIGKILL", variant="error")
                yield Button("Cancel (Esc)", id="cancel", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()  # Enter by reflex must not kill anything

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose(event.button.id if event.button.id != "cancel" else "")

    def action_choose(self, name: str) -> None:
        self.dismiss(int(getattr(signal, name)) if name else None)

"""The contract between a screen and the app's poller."""

from __future__ import annotations

from rich.text import Text
from textual.screen import Screen
from textual.widgets import Static

from gpuwatch.tui.snapshot import Snapshot, View


class Line(Static):
    """A Static that repaints only when its text really changed (each repaint costs SSH bytes)."""

    text: Text | None = None

    def set_text(self, text: Text) -> None:
        if text != self.text:
            self.text = text
            self.update(text)


class LiveScreen(Screen):
    """A screen fed by the poller. Only the visible one is fed, so hidden ones never redraw,
    and an unchanged snapshot draws nothing (idle terminals over SSH stay quiet)."""

    shown: Snapshot | None = None

    def update_snapshot(self, snap: Snapshot) -> None:
        if snap != self.shown:
            previous, self.shown = self.shown, snap
            self.show(snap, previous)

    def set_line(self, selector: str, text: Text) -> None:
        self.query_one(selector, Line).set_text(text)

    def on_resize(self) -> None:
        if self.shown is not None:
            self.show(self.shown, None)  # widths changed: everything re-renders

    def view(self) -> View:
        raise NotImplementedError

    def show(self, snap: Snapshot, previous: Snapshot | None) -> None:
        """Render `snap`; `previous` (None = draw everything) lets parts that did not change be skipped."""
        raise NotImplementedError

    def on_screen_resume(self) -> None:
        # Data may be a whole refresh old by now; ask for fresh data rather than wait.
        self.app.poll_now()

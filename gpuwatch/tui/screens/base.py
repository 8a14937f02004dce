"""The contract between a screen and the app's poller."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Region
from textual.screen import Screen
from textual.widgets import DataTable, Input, Static

from gpuwatch.tui.snapshot import Snapshot, View


def _styled_chars(text: Text) -> list[tuple[str, str]]:
    """Each character with the styles that cover it, so two texts can be compared cell by cell."""
    styles = [str(text.style)] * len(text.plain)
    for span in text.spans:
        for i in range(span.start, min(span.end, len(styles))):
            styles[i] += f";{span.style}"
    return list(zip(text.plain, styles))


def changed_cells(old: Text, new: Text) -> tuple[int, int | None]:
    """(first column that differs, column after the last that differs), None = to the line's end."""
    a, b = _styled_chars(old), _styled_chars(new)
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    first = cell_len(new.plain[:start])
    if len(a) != len(b) or cell_len(old.plain) != cell_len(new.plain):
        return first, None  # the tail moved
    end = len(b)
    while end > start and a[end - 1] == b[end - 1]:
        end -= 1
    return first, cell_len(new.plain[:end])


class Line(Static):
    """One line of text that repaints only when it changed, and then only up to its last
    changed column (Textual writes from the widget's left edge): a GPU whose utilisation went
    from 53 % to 54 % no longer resends its memory, power and state over SSH. Lines are one
    row high (app.tcss), so a new text never needs a layout pass."""

    text: Text | None = None

    def render(self) -> Text:
        return self.text if self.text is not None else Text()

    def set_text(self, text: Text) -> None:
        if self.text is not None and text == self.text and text.style == self.text.style:
            return  # rich's Text equality ignores the base style
        old, self.text = self.text, text
        width = self.content_size.width
        if old is None or not width:
            self.refresh()
            return
        first, end = changed_cells(old, text)
        end = width if end is None else min(end, width)
        if first < end:
            self.refresh(Region(first, 0, end - first, 1))


class LiveScreen(Screen):
    """A screen fed by the poller. Only the visible one is fed, so hidden ones never redraw,
    and an unchanged snapshot draws nothing (idle terminals over SSH stay quiet)."""

    shown: Snapshot | None = None

    def update_snapshot(self, snap: Snapshot) -> None:
        if snap != self.shown:
            previous, self.shown = self.shown, snap
            self.show(snap, previous)

    def on_mount(self) -> None:
        # The frame is painted before the first snapshot arrives: say what it is waiting for.
        for line in self.query("#status").results(Line):
            line.set_text(Text("reading the store…", style="dim"))

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


class UserFiltered(LiveScreen):
    """A live screen with a table filtered by user: `/` types a user name, `m` toggles only
    mine, Esc clears. The app keeps the filter, so it follows the user across screens.
    A subclass names its table in TABLE and redraws it in `_fill`."""

    TABLE = ""  # the filtered table's selector, e.g. "#runs"

    def action_only_mine(self) -> None:
        self.app.only_mine = not self.app.only_mine
        self._fill()

    def action_filter_user(self) -> None:
        box = self.query_one("#user-filter", Input)
        box.remove_class("hidden")
        box.value = self.app.user_filter or ""
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.app.user_filter = event.value.strip() or None
        self.app.only_mine = False
        event.input.add_class("hidden")
        self.query_one(self.TABLE, DataTable).focus()
        self._fill()

    def action_clear_filter(self) -> None:
        self.query_one("#user-filter", Input).add_class("hidden")
        self.app.user_filter = None
        self.app.only_mine = False
        self.query_one(self.TABLE, DataTable).focus()
        self._fill()

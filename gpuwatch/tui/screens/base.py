"""The contract between a screen and the app's poller."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.containers import Horizontal
from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip
from textual.visual import Visual, visualize
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


class Lines(Static):
    """Lines of text, each repainted only when it changed, and then only up to its last changed
    column (Textual writes from the widget's left edge): a GPU whose utilisation went from 53 %
    to 54 % no longer resends its memory, power and state over SSH. The number of lines sets
    the height (app.tcss), so new texts need a layout pass only when that number changes."""

    texts: tuple[Text, ...] = ()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._strips: dict[int, Strip] = {}  # rendered lines, each kept until its text changes

    def render(self) -> Text:  # what sizes the widget; the lines are rendered one by one
        return Text("\n").join(self.texts)

    def render_line(self, y: int) -> Strip:
        # Static renders every line again when one changed: render only the changed ones.
        self._dirty_regions.clear()  # what Static's render would have cleared
        width = self.size.width
        strip = self._strips.get(y)
        if strip is None or strip.cell_length != width:
            text = self.texts[y] if y < len(self.texts) else Text()
            strip = self._strips[y] = Visual.to_strips(
                self, visualize(self, text), width, 1, self.visual_style
            )[0]
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def set_texts(self, texts: list[Text]) -> None:
        old, self.texts = self.texts, tuple(texts)
        width = self.content_size.width
        if len(old) != len(texts) or not width:
            self._strips.clear()
            self.refresh(layout=len(old) != len(texts))
            return
        for y, (before, after) in enumerate(zip(old, texts)):
            if after == before and after.style == before.style:
                continue  # rich's Text equality ignores the base style
            self._strips.pop(y, None)
            first, end = changed_cells(before, after)
            end = width if end is None else min(end, width)
            if first < end:
                self.refresh(Region(first, y, end - first, 1))


class Line(Lines):
    """One line of text (see Lines)."""

    @property
    def text(self) -> Text | None:
        return self.texts[0] if self.texts else None

    def set_text(self, text: Text) -> None:
        self.set_texts([text])


class CellColumns(Horizontal):
    """Rows of cells in fixed-width columns, each column one Lines widget (the last takes the
    rest of the width). Textual writes a repaint from the left edge of a widget, so a changed
    cell resends that cell alone; a widget per column rather than per cell keeps the widget
    count (memory and per-frame work) small. A row given as one text is cut at the columns."""

    columns: list[Lines] = []
    widths: tuple[int, ...] | None = None  # as mounted

    def set_rows(self, rows: list[list[Text]], widths: tuple[int, ...]) -> None:
        """Show `rows`, each a cell per column (len(widths) + 1) or one text to cut; a cell is
        cut by characters, so a text to cut has no wide characters before its last column."""
        cuts = [sum(widths[: k + 1]) for k in range(len(widths))]
        rows = [cells if len(cells) == len(widths) + 1 else list(cells[0].divide(cuts)) for cells in rows]
        if widths != self.widths:
            self.remove_children()
            self.columns = [Lines() for _ in range(len(widths) + 1)]
            for column, w in zip(self.columns, (*widths, "1fr")):
                column.styles.width = w
            self.mount_all(self.columns)
            self.widths = widths
        for k, column in enumerate(self.columns):
            column.set_texts([cells[k] if k < len(cells) else Text() for cells in rows])

    def plain_lines(self) -> list[str]:
        """What the rows read on screen, one string per row."""
        return ["".join(t.plain for t in row) for row in zip(*(c.texts for c in self.columns))]


class StatusLine(CellColumns):
    """The top line: what the data is, then when it was updated ("14:05:09"). The clock is a
    column of its own: a changed line is resent from its widget's left edge, so each second
    resends the eight characters of the clock and not the words before it."""

    def set_text(self, words: Text, clock: Text | None = None) -> None:
        self.set_rows([[words, clock or Text()]], (words.cell_len,))

    @property
    def text(self) -> Text:
        return Text("").join(column.texts[0] for column in self.columns)


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
        for line in self.query("#status").results(StatusLine):
            line.set_text(Text("reading the store…", style="dim"))

    def set_line(self, selector: str, text: Text) -> None:
        self.query_one(selector, Line).set_text(text)

    def set_status(self, words: Text, clock: Text | None = None) -> None:
        self.query_one("#status", StatusLine).set_text(words, clock)

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

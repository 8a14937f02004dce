"""DataTables for text that users wrote: PlainTable shows strings as written (DataTable reads
them as markup, and a command line holding "[/x]" would stop the TUI), and CellTable repaints
only the cells that changed, in as few bytes as the terminal needs: a new process tick changes
SM% and CPU% of rows already shown, and DataTable.update_cell would repaint (and resend over
SSH) the whole table."""

from __future__ import annotations

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.coordinate import Coordinate
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey


def merge_cells(strip: Strip) -> Strip:
    """Join neighbouring segments that look the same. DataTable gives every cell its own
    segment (its style carries the cell's coordinate for the mouse), so a row would be written
    with a colour code and a reset per cell: a third of the bytes of a process row."""
    merged: list[Segment] = []
    looks = None
    for segment in strip:
        plain = segment.style.clear_meta_and_links() if segment.style else None
        if merged and plain == looks and not segment.control:
            merged[-1] = Segment(merged[-1].text + segment.text, merged[-1].style)
        else:
            merged.append(segment)
            looks = plain
    return Strip(merged, strip.cell_length)


def _plain(cell):
    """A string as a text that is not parsed (one line, like DataTable's own cells)."""
    return Text(cell, no_wrap=True, end="") if isinstance(cell, str) else cell


class PlainTable(DataTable):
    # DataTable keys its render caches by an update count that every changed cell bumps, and
    # never reads an older count's entries again; it only evicts them at 1,000 rows and lines
    # and 10,000 cells. A process tick changes every row, so a TUI left open kept ~10 screens
    # of dead rendered rows (strips, segments and their caches): several MB of its RSS.
    @property
    def _update_count(self) -> int:
        return self._updates

    @_update_count.setter
    def _update_count(self, count: int) -> None:
        self._updates = count
        for cache in (self._cell_render_cache, self._row_render_cache, self._row_renderable_cache,
                      self._line_cache):
            cache.clear()

    def add_column(self, label, *args, **kwargs):
        # Not markup either: the first emoji substitution alone loads 1.5 MB of Rich's table.
        return super().add_column(_plain(label), *args, **kwargs)

    def add_row(self, *cells, **kwargs):
        return super().add_row(*map(_plain, cells), **kwargs)

    def update_cell(self, row_key, column_key, value, *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, _plain(value), update_width=update_width)


class CellTable(PlainTable):
    _batching = False

    def render_line(self, y: int) -> Strip:
        strip = super().render_line(y)
        if y < self.header_height or self.cursor_type != "row":
            return strip  # a header click needs each column's own coordinate
        return merge_cells(strip)  # a row click needs only the row, which every cell carries

    def refresh(self, *regions, **kwargs):
        if self._batching:
            return self  # update_cells repaints just the cells it changed
        return super().refresh(*regions, **kwargs)

    def update_cells(self, changes: list[tuple[str, str, str]]) -> None:
        """Set (row key, column key, value) cells; repaint only them, or the whole table when a
        value is wider than its column."""
        widen = any(cell_len(value) > self.columns[ColumnKey(column)].content_width
                    for _, column, value in changes)
        self._batching = True
        try:
            for row, column, value in changes:
                self.update_cell(row, column, value, update_width=widen)
        finally:
            self._batching = False
        if widen:
            self.refresh(layout=True)
            return
        for row, column, _ in changes:
            self.refresh_coordinate(Coordinate(self.get_row_index(row), self.get_column_index(column)))

"""DataTables for text that users wrote: PlainTable shows strings as written (DataTable reads
them as markup, and a command line holding "[/x]" would stop the TUI), and CellTable repaints
only the cells that changed, in as few bytes as the terminal needs: a new process tick changes
SM% and CPU% of rows already shown, and DataTable.update_cell would repaint (and resend over
SSH) the whole table."""

from __future__ import annotations

from itertools import accumulate

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.cache import LRUCache
from textual.geometry import Region
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
        for cache in (
            self._cell_render_cache,
            self._row_render_cache,
            self._row_renderable_cache,
            self._line_cache,
        ):
            cache.clear()

    def add_column(self, label, *args, **kwargs):
        # Not markup either: the first emoji substitution alone loads 1.5 MB of Rich's table.
        return super().add_column(_plain(label), *args, **kwargs)

    def add_row(self, *cells, **kwargs):
        return super().add_row(*map(_plain, cells), **kwargs)

    def update_cell(self, row_key, column_key, value, *, update_width: bool = False) -> None:
        super().update_cell(row_key, column_key, _plain(value), update_width=update_width)


class CellTable(PlainTable):
    """A PlainTable of one-line rows of plain strings, for a table whose figures change in place."""

    _batching = False
    DRAWN_CELLS = 512  # rendered cells kept: a screen of 160x48 shows ~350

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._drawn_cells: LRUCache[tuple, list] = LRUCache(self.DRAWN_CELLS)

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ):
        # DataTable renders every cell again after any cell changed (its cache is keyed by an
        # update count); a process tick changes two cells of each row, so keep the others.
        if row_index < 0 or column_index < 0:  # the header
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        cell = self._data[self._row_locations.get_key(row_index)][
            self._column_locations.get_key(column_index)
        ]
        key = (
            row_index,
            column_index,
            cell.plain,
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        lines = self._drawn_cells.get(key)
        if lines is None:
            lines = self._drawn_cells[key] = super()._render_cell(
                row_index, column_index, base_style, width, cursor, hover
            )
        return lines

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
        widen = any(
            cell_len(value) > self.columns[ColumnKey(column)].content_width for _, column, value in changes
        )
        self._batching = True
        try:
            for row, column, value in changes:
                self.update_cell(row, column, value, update_width=widen)
        finally:
            self._batching = False
        if widen:
            self.refresh(layout=True)
            return
        # One region per row, from its first to its last changed cell, and none for rows out of
        # sight (DataTable.refresh_coordinate sums the heights of the rows above, for each cell).
        spans: dict[str, tuple[int, int]] = {}
        for row, column, _ in changes:
            k = self.get_column_index(column)
            first, last = spans.get(row, (k, k))
            spans[row] = (min(first, k), max(last, k))
        x = list(
            accumulate(
                (c.get_render_width(self) for c in self.ordered_columns), initial=self._row_label_column_width
            )
        )
        top = self.header_height if self.show_header else 0
        window = self.window_region
        for row, (first, last) in spans.items():
            region = Region(x[first], top + self.get_row_index(row), x[last + 1] - x[first], 1)
            if window.overlaps(region):
                self.refresh(region.translate(-self.scroll_offset))

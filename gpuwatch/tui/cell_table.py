"""A DataTable whose changed cells repaint alone: a new process tick changes SM% and CPU% of
rows already shown, and DataTable.update_cell would repaint (and resend over SSH) the whole table."""

from __future__ import annotations

from rich.cells import cell_len
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey


class CellTable(DataTable):
    _batching = False

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

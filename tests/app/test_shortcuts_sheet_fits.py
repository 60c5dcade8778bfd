"""Help → Keyboard shortcuts shows every row at once: at its old fixed 520 px the message box's keys (Enter,
Shift+Enter, Tab, Ctrl+Tab) were below the fold of a scrolled table, seen in the walkthrough. Measured: each
row's rectangle against the table's viewport, on a screen with room for them."""

from __future__ import annotations

from app.window_extras import show_shortcuts


def test_the_shortcuts_sheet_shows_every_row_without_scrolling(qtbot, services):
    window = services.window
    window.show()
    qtbot.waitExposed(window)
    sheet = show_shortcuts(window)
    qtbot.waitExposed(sheet)
    table = sheet.table
    assert sheet.height() < window.screen().availableGeometry().height()  # the screen has room for it
    assert not table.verticalScrollBar().isVisible(), f"{table.rowCount()} rows in a {table.height()} px table"
    view = table.viewport().rect()
    for row in range(table.rowCount()):
        rect = table.visualRect(table.model().index(row, 2))
        assert view.contains(rect), (sheet.rows()[row], rect, view)
    sheet.close()

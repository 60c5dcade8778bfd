"""Help → Keyboard shortcuts: every key the window answers, in one sheet.

Read from the menus themselves (each action's text and keys), so a shortcut
added to a menu is listed without anyone remembering to list it; the keys of
the message box, which are no menu's, are added by hand below.
"""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QMainWindow,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

# The message box's own keys (app/chat/chat_pane.py Composer): no menu holds them.
MESSAGE_BOX_KEYS = (
    ("Message box", "Send the message", "Enter"),
    ("Message box", "New line", "Shift+Enter"),
    ("Message box", "Next / previous control (leave the box)", "Tab / Shift+Tab"),
    ("Message box", "Type a tab character", "Ctrl+Tab"),
)


def menu_shortcuts(window: QMainWindow) -> list[tuple[str, str, str]]:
    """``(menu, command, keys)`` for every menu-bar action with a shortcut, in menu order."""
    rows = []
    for top in window.menuBar().actions():
        menu = top.menu()
        if menu is None:
            continue
        for action in menu.actions():
            keys = [k for k in action.shortcuts() if not k.isEmpty()]
            if isinstance(action, QAction) and keys:
                rows.append((top.text().replace("&", ""), action.text().replace("&", "").rstrip("…"),
                             " or ".join(k.toString(QKeySequence.SequenceFormat.NativeText) for k in keys)))
    return rows


class ShortcutsSheet(QDialog):
    """A read-only table of the shortcuts: where, what, which keys."""

    def __init__(self, window: QMainWindow, parent: QWidget | None = None) -> None:
        super().__init__(parent or window)
        self.setWindowTitle("Keyboard shortcuts")
        rows = [*menu_shortcuts(window), *MESSAGE_BOX_KEYS]
        self.table = QTableWidget(len(rows), 3)
        self.table.setHorizontalHeaderLabels(["Where", "Command", "Keys"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        for r, row in enumerate(rows):
            for c, text in enumerate(row):
                self.table.setItem(r, c, QTableWidgetItem(text))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        col = QVBoxLayout(self)
        col.addWidget(self.table)
        col.addWidget(close)
        self.resize(620, self._height_for_every_row(col, close, window))

    def _height_for_every_row(self, col: QVBoxLayout, close: QWidget, window: QWidget) -> int:
        """Tall enough to show every row without scrolling (at 520 px the message box's keys were below the
        fold), but never taller than most of the screen."""
        table = self.table
        margins = col.contentsMargins()
        needed = (table.horizontalHeader().sizeHint().height() + table.verticalHeader().length()
                  + 2 * table.frameWidth() + col.spacing() + close.sizeHint().height()
                  + margins.top() + margins.bottom())
        screen = window.screen() or self.screen()
        return min(needed, int(screen.availableGeometry().height() * 0.9)) if screen is not None else needed

    def rows(self) -> list[tuple[str, str, str]]:
        return [tuple(self.table.item(r, c).text() for c in range(3))  # type: ignore[misc]
                for r in range(self.table.rowCount())]

"""The model picker in the chat header: which model is loaded, and a menu of
the recent ones, the built-in one and "Open…", so switching is one click from
where the user is typing rather than a trip to the Model menu.

Choosing a model opens the load sheet for it (context, threads, memory) rather
than loading at once: a model too big for memory is better caught before it
loads than after the system kills the engine.

The menu opens on a search box over the model library (the Models page's
rows: every GGUF on this computer): typing narrows it to the files whose name,
architecture, quantization or MTP status hold every word, and Enter picks the
first one.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QMenu, QToolButton, QWidget, QWidgetAction

from app.models.library_rows import LibraryFilter, LibraryRow, size_text
from engine.worker.events import ModelInfo

BUILT_IN = "Built-in: Gemma 3 270M"
MAX_FOUND = 8  # library matches listed under the search box


class ModelPicker(QWidget):
    """Signals:
        sig_pick(object): load this model (a path; None: the built-in one) — opens the load sheet.
        sig_open(): choose a GGUF file.
        sig_eject(): unload the loaded model.
        sig_library_wanted(): the menu opened before the library was ever scanned (the Models page scans it).
    """

    sig_pick = Signal(object)
    sig_open = Signal()
    sig_eject = Signal()
    sig_library_wanted = Signal()

    def __init__(self, recent: list[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.recent = recent  # the settings' list, read when the menu opens
        self.model: ModelInfo | None = None
        self.library: list[LibraryRow] | None = None  # the library's rows (None: not scanned yet)
        self._found: list[QAction] = []  # the menu's actions for the current search
        self.button = QToolButton()
        self.button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.button.setToolTip("Choose the model to chat with")
        self.menu = QMenu(self)
        self.menu.aboutToShow.connect(self._fill_menu)
        self.button.setMenu(self.menu)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("Model:"))
        row.addWidget(self.button)
        row.addStretch(1)
        self.show_model(None, loading=True)

    def show_model(self, model: ModelInfo | None, loading: bool = False) -> None:
        """Name the model actually loaded (never the one merely asked for)."""
        self.model = model
        if loading:
            text = "Loading…"
        elif model is None:
            text = "No model loaded — choose one"
        else:
            text = BUILT_IN if model.is_default_model else Path(model.path).name
        self.button.setText(text)  # the arrow is Qt's own menu indicator (a "▾" here made two)
        self.button.setToolTip(model.path if model is not None else "Choose the model to chat with")

    def set_library(self, rows: list[LibraryRow]) -> None:
        """The library's rows, after each scan; an open menu's search follows."""
        self.library = rows
        if self.menu.isVisible():
            self._search(self.search.text())

    def matches(self, text: str) -> list[LibraryRow]:
        """The library's readable files matching every word of ``text`` (nothing for no words)."""
        if not text.strip():
            return []
        flt = LibraryFilter(text=text, where="disk")
        return [r for r in self.library or [] if r.path and r.architecture != "?" and flt.matches(r)][:MAX_FOUND]

    def _search(self, text: str) -> None:
        """List the matches under the search box, above the recent models."""
        for action in self._found:
            self.menu.removeAction(action)
        self._found = []
        rows = self.matches(text)
        if text.strip() and not rows:
            none = QAction("Searching the library…" if self.library is None else "No model in the library matches",
                           self.menu)
            none.setEnabled(False)
            self._found.append(none)
        for row in rows:
            action = QAction(f"{row.name}  ·  {row.architecture} · {row.quantization} · {size_text(row.size)}",
                             self.menu)
            action.setToolTip(row.path or "")
            action.triggered.connect(lambda _checked=False, p=row.path: self.sig_pick.emit(p))
            self._found.append(action)
        if self._found:
            sep = QAction(self.menu)
            sep.setSeparator(True)
            self._found.append(sep)
        below = self.menu.actions()[1]  # the first entry after the search box
        for action in self._found:
            self.menu.insertAction(below, action)

    def _pick_first(self) -> None:
        rows = self.matches(self.search.text())
        if rows:
            self.menu.close()
            self.sig_pick.emit(rows[0].path)

    def _fill_menu(self) -> None:
        """Built when opened, so the recent list is always the settings' current one."""
        self.menu.clear()
        self._found = []
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search the model library…")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._search)
        self.search.returnPressed.connect(self._pick_first)
        box = QWidgetAction(self.menu)
        box.setDefaultWidget(self.search)
        self.menu.addAction(box)
        QTimer.singleShot(0, self.search.setFocus)  # typing searches as soon as the menu is open
        if self.library is None:
            self.sig_library_wanted.emit()
        loaded = self.model.path if self.model is not None and not self.model.is_default_model else None
        for path in self.recent:
            action = self.menu.addAction(Path(path).name)
            action.setToolTip(path)
            action.setCheckable(True)
            action.setChecked(path == loaded)
            action.triggered.connect(lambda _checked=False, p=path: self.sig_pick.emit(p))
        builtin = self.menu.addAction(BUILT_IN)
        builtin.setCheckable(True)
        builtin.setChecked(self.model is not None and self.model.is_default_model)
        builtin.triggered.connect(lambda: self.sig_pick.emit(None))
        self.menu.addSeparator()
        self.menu.addAction("Open a GGUF file…").triggered.connect(self.sig_open.emit)
        if self.model is not None:
            self.menu.addAction("Load settings for this model…").triggered.connect(
                lambda: self.sig_pick.emit(None if self.model is None or self.model.is_default_model
                                           else self.model.path))
            self.menu.addAction("Eject (unload the model)").triggered.connect(self.sig_eject.emit)
        self.menu.setToolTipsVisible(True)

    def actions_text(self, fill: bool = True) -> list[str]:
        """The menu's entries as shown (for tests and screenshots); ``fill``: built afresh first."""
        if fill:
            self._fill_menu()
        return [a.text() for a in self.menu.actions() if not a.isSeparator() and a.text()]

"""The model picker in the chat header: which model is loaded, and a menu of
the recent ones, the built-in one and "Open…", so switching is one click from
where the user is typing rather than a trip to the Model menu.

Choosing a model opens the load sheet for it (context, threads, memory) rather
than loading at once: a model too big for memory is better caught before it
loads than after the system kills the engine.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMenu, QToolButton, QWidget

from engine.worker.events import ModelInfo

BUILT_IN = "Built-in: Gemma 3 270M"


class ModelPicker(QWidget):
    """Signals:
        sig_pick(object): load this model (a path; None: the built-in one) — opens the load sheet.
        sig_open(): choose a GGUF file.
        sig_eject(): unload the loaded model.
    """

    sig_pick = Signal(object)
    sig_open = Signal()
    sig_eject = Signal()

    def __init__(self, recent: list[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.recent = recent  # the settings' list, read when the menu opens
        self.model: ModelInfo | None = None
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
        self.button.setText(text + "  ▾")
        self.button.setToolTip(model.path if model is not None else "Choose the model to chat with")

    def _fill_menu(self) -> None:
        """Built when opened, so the recent list is always the settings' current one."""
        self.menu.clear()
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

    def actions_text(self) -> list[str]:
        """The menu's entries as shown (for tests and screenshots)."""
        self._fill_menu()
        return [a.text() for a in self.menu.actions() if not a.isSeparator()]

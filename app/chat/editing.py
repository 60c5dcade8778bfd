"""Editing the last message without losing it: the bar above the composer.

"Edit last" used to delete the exchange and put its text in the composer, so
a change of mind lost the reply. Now the text goes to the composer and this
bar says what is being edited; nothing is changed until the edit is sent, and
Cancel (or Esc) puts back whatever draft the composer held before.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from app.theme import Palette


class EditBar(QWidget):
    """"Editing your last message" with a Cancel button; hidden when not editing.

    Signals:
        sig_cancel(): the user gave up the edit.
    """

    sig_cancel = Signal()

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.message_id: int | None = None  # the message being edited
        self.draft = ""  # what the composer held before; Cancel puts it back
        self.label = QLabel("Editing your last message — Send replaces it and its reply; "
                            "Cancel (Esc) keeps the conversation as it is.")
        self.label.setWordWrap(True)
        self.label.setStyleSheet(f"color:{palette.accent};")
        self.cancel_button = QPushButton("Cancel")
        row = QHBoxLayout(self)
        row.setContentsMargins(4, 0, 4, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.cancel_button)
        self.cancel_button.clicked.connect(self.sig_cancel)
        self.hide()

    @property
    def editing(self) -> bool:
        return self.message_id is not None

    def begin(self, message_id: int, draft: str) -> None:
        self.message_id, self.draft = message_id, draft
        self.show()

    def end(self) -> str:
        """Leave editing; returns the draft to restore."""
        draft, self.message_id, self.draft = self.draft, None, ""
        self.hide()
        return draft

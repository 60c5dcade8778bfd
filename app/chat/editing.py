"""Editing the last message without losing it: the bar above the composer.

"Edit last" (or a message's Edit link) puts the message's text in the
composer and this bar says what is being edited; nothing is changed until
the edit is sent, and Cancel (or Esc) puts back whatever draft the composer
held before. Sending starts a branch: the old message and what followed it
stay, a version of the message (``‹ 1/2 ›`` switches back).
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
        self.label = QLabel("Editing a message — Send starts a new branch from it (the old one stays: "
                            "‹ 1/2 › switches back); Cancel (Esc) keeps the conversation as it is.")
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

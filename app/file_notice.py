"""The strip above the chat that says what happened to a file the app could
not read at start (settings, the conversations database) and where it went.

It stays until dismissed: a status-bar message that fades after seconds is
easy to miss, and the user may want the path of the kept file.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.theme import Palette


class FileNotice(QFrame):
    """One label for every start-up notice, and a Dismiss button."""

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("fileNotice")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # the path can be copied
        self.button = QPushButton("Dismiss")
        self.button.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignTop)
        self.setStyleSheet(f"#fileNotice {{ border:1px solid {palette.bad}; border-radius:6px; }}")
        self.hide()

    def show_notices(self, notices: Sequence[str]) -> None:
        self.label.setText("\n\n".join(notices))
        self.setVisible(bool(notices))

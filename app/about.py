"""Help → About: which app, which Qt, which engine build and which patches.

What a bug report needs in one place. The engine lines come from the build
record (``engine.build_record``), read in this process without loading
llama.cpp; the worker's handshake says the same once it is up.
"""

from __future__ import annotations

import html
import platform

import PySide6
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from engine import frozen
from engine.build_record import app_version, describe, read_record


def about_lines() -> list[str]:
    """The facts, as plain lines (also what the dialog's text is made of)."""
    build = "packaged app" if frozen.is_frozen() else "source checkout"
    return [
        f"MTP Studio {app_version()} ({build})",
        f"Qt {qVersion()}, PySide6 {PySide6.__version__}, Python {platform.python_version()}",
        f"{platform.system()} {platform.release()} {platform.machine()}",
        *describe(read_record()),
    ]


class AboutDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About MTP Studio")
        icon = QLabel()
        app_icon = QIcon(parent.windowIcon() if parent is not None else QIcon())
        if not app_icon.isNull():
            icon.setPixmap(app_icon.pixmap(96, 96))
        lines = about_lines()
        self.text = QLabel(
            f"<h3>{html.escape(lines[0])}</h3>"
            "<p>Runs local language models faster with multi-token prediction (MTP) speculative decoding.</p>"
            + "<br>".join(html.escape(line) for line in lines[1:])
        )
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.text.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(icon, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.text, 1)
        col = QVBoxLayout(self)
        col.addLayout(row)
        col.addWidget(buttons)
        self.setMinimumWidth(460)

"""The foot of a settings dialog's form: OK / Cancel, and a line that says why
OK did not close the dialog (the dialog stays open with what was typed)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel

from app.theme import palette_for


def add_ok_cancel(form: QFormLayout, dialog: QDialog) -> QLabel:
    """Add the hidden problem line and the OK / Cancel buttons of ``dialog`` to ``form``; returns the line."""
    problem = QLabel()
    problem.setWordWrap(True)
    problem.setStyleSheet(f"color:{palette_for('system').bad};")
    problem.hide()
    form.addRow(problem)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    form.addRow(buttons)
    dialog.installEventFilter(_TallEnough(dialog))
    return problem


class _TallEnough(QObject):
    """Keeps the dialog as tall as its form needs at its width. A form with wrapped notes has a height for
    each width, which Qt does not enforce on a window: shown at its plain minimum, the last rows (the system
    prompt) ran under OK and Cancel."""

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if event.type() in (QEvent.Type.Show, QEvent.Type.Resize, QEvent.Type.LayoutRequest) \
                and isinstance(watched, QDialog) and watched.layout() is not None:
            need = watched.layout().totalHeightForWidth(watched.width())
            if need > watched.minimumHeight():
                watched.setMinimumHeight(need)
        return False


def show_problem(line: QLabel, text: str) -> None:
    """Say on ``line`` why OK did not close the dialog."""
    line.setText(text)
    line.show()

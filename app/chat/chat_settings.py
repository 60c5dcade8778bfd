"""Per-conversation settings: sampling, speculative decoding and the system
prompt, stored with the conversation. Anything not set falls back to the
app's preferences (and "auto" to the autotune profile): app/reply_values.py.

OK saves before the dialog closes: a system prompt that is not valid text, or
a disk that refuses the write, keeps the dialog open with what was typed and
a line that says why."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QDialog, QFormLayout, QPlainTextEdit, QWidget

from app.form_buttons import add_ok_cancel, show_problem
from app.reply_fields import ReplyFields
from app.reply_values import ReplyValues
from app.text_check import is_text, not_text_notice
from engine.speculative.settings import SpeculativeSettings


class ChatSettingsDialog(QDialog):
    def __init__(self, values: ReplyValues, system_prompt: str, max_draft: int,
                 parent: QWidget | None = None, auto: SpeculativeSettings | None = None,
                 auto_speedup: float | None = None,
                 save: Callable[[ReplyValues, str], str] | None = None) -> None:
        """``save(values, system_prompt)``: store them; returns why it could not ("" when it did)."""
        super().__init__(parent)
        self._save = save
        self.setWindowTitle("This chat's settings")
        form = QFormLayout(self)
        self.reply = ReplyFields(form, values, max_draft, auto, auto_speedup)
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setFixedHeight(80)
        form.addRow("System prompt", self.system_prompt)
        self.problem = add_ok_cancel(form, self)  # why OK did not close the dialog

    def values(self) -> ReplyValues:
        return self.reply.values()

    def accept(self) -> None:
        prompt = self.system_prompt.toPlainText()
        problem = "" if is_text(prompt) else not_text_notice("System prompt")
        if not problem and self._save is not None:
            problem = self._save(self.values(), prompt)
        if problem:  # the dialog stays open with what was typed
            show_problem(self.problem, problem)
            return
        super().accept()

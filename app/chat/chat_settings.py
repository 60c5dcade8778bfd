"""Per-conversation settings: sampling, speculative decoding and the system
prompt, stored with the conversation. Anything not set falls back to the
app's preferences (and "auto" to the autotune profile)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QPlainTextEdit, QWidget

from app.reply_fields import KEYS, SAMPLING_KEYS, ReplyFields
from app.settings import Settings
from engine.sampling import RANDOM_SEED
from engine.speculative.settings import SpeculativeSettings


@dataclass(frozen=True)
class ReplyValues:
    """How a reply in one chat is sampled and drafted: its own settings over the preferences."""

    sampling_preset: str  # precise | balanced | creative | custom: a name for the values below
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    repeat_last_n: int
    presence_penalty: float
    frequency_penalty: float
    seed: int  # -1: random
    max_tokens: int
    speculative: str  # auto | mtp | ngram | mtp+ngram | off
    n_max: int
    p_min: float

    def sampling(self) -> dict[str, Any]:
        """The generate request's sampling fields (llama.cpp's names); seed -1 is a new one per reply."""
        fields = {k: getattr(self, k) for k in SAMPLING_KEYS}
        return {**fields, "seed": RANDOM_SEED if self.seed < 0 else self.seed}


def effective(global_settings: Settings, chat: dict[str, Any]) -> ReplyValues:
    """The values a reply in this chat uses: the chat's own, else the preferences'
    (a chat saved before a field existed takes that field from the preferences)."""
    return ReplyValues(**{k: chat.get(k, getattr(global_settings, k)) for k in KEYS})


class ChatSettingsDialog(QDialog):
    def __init__(self, values: dict[str, Any], system_prompt: str, max_draft: int,
                 parent: QWidget | None = None, auto: SpeculativeSettings | None = None,
                 auto_speedup: float | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("This chat's settings")
        form = QFormLayout(self)
        self.reply = ReplyFields(form, values, max_draft, auto, auto_speedup)
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setFixedHeight(80)
        form.addRow("System prompt", self.system_prompt)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def values(self) -> dict[str, Any]:
        return self.reply.values()

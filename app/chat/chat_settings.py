"""Per-conversation settings: sampling, speculative decoding and the system
prompt, stored with the conversation. Anything not set falls back to the
app's preferences (and "auto" to the autotune profile)."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from app.settings import Settings

KEYS = ("temperature", "max_tokens", "speculative", "n_max", "p_min")


def effective(global_settings: Settings, chat: dict[str, Any]) -> dict[str, Any]:
    """The values a reply in this chat uses."""
    return {k: chat.get(k, getattr(global_settings, k)) for k in KEYS}


class ChatSettingsDialog(QDialog):
    def __init__(self, values: dict[str, Any], system_prompt: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("This chat's settings")
        form = QFormLayout(self)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.1, value=values["temperature"])
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, value=values["max_tokens"])
        self.speculative = QComboBox()
        self.speculative.addItems(["auto", "mtp", "off"])
        self.speculative.setCurrentText(values["speculative"])
        self.n_max = QSpinBox(minimum=1, maximum=8, value=values["n_max"])
        self.p_min = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.05, value=values["p_min"])
        self.system_prompt = QPlainTextEdit(system_prompt)
        self.system_prompt.setFixedHeight(80)
        form.addRow("Temperature (0 = greedy)", self.temperature)
        form.addRow("Max reply tokens", self.max_tokens)
        form.addRow("Speculative decoding", self.speculative)
        form.addRow("Draft depth (n_max)", self.n_max)
        form.addRow("Draft gate (p_min)", self.p_min)
        form.addRow("System prompt", self.system_prompt)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)

    def values(self) -> dict[str, Any]:
        return {"temperature": self.temperature.value(), "max_tokens": self.max_tokens.value(),
                "speculative": self.speculative.currentText(), "n_max": self.n_max.value(),
                "p_min": self.p_min.value()}

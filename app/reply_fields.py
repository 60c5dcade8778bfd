"""The form rows both the preferences and a chat's own settings show: how a
reply is sampled and drafted. The deepest draft offered is the engine's
(``EngineClient.max_draft``, from the worker's handshake), never a copy."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QComboBox, QDoubleSpinBox, QFormLayout, QSpinBox

KEYS = ("temperature", "max_tokens", "speculative", "n_max", "p_min")


class ReplyFields:
    def __init__(self, form: QFormLayout, values: dict[str, Any], max_draft: int) -> None:
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.1, value=values["temperature"])
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, value=values["max_tokens"])
        self.speculative = QComboBox()
        self.speculative.addItems(["auto", "mtp", "off"])
        self.speculative.setCurrentText(values["speculative"])
        self.speculative.setToolTip("auto: the autotune profile for this model and machine, else MTP")
        self.n_max = QSpinBox(minimum=1, maximum=max_draft, value=values["n_max"])
        self.p_min = QDoubleSpinBox(minimum=0.0, maximum=1.0, singleStep=0.05, value=values["p_min"])
        form.addRow("Temperature (0 = greedy)", self.temperature)
        form.addRow("Max reply tokens", self.max_tokens)
        form.addRow("Speculative decoding", self.speculative)
        form.addRow("Draft depth (n_max)", self.n_max)
        form.addRow("Draft gate (p_min)", self.p_min)

    def values(self) -> dict[str, Any]:
        return {"temperature": self.temperature.value(), "max_tokens": self.max_tokens.value(),
                "speculative": self.speculative.currentText(), "n_max": self.n_max.value(),
                "p_min": self.p_min.value()}

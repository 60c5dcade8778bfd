"""The preset sheet of one model: the parts it brings when it loads (sampling, context, threads, a system
prompt for new chats, a chat template over its own). Each part is a checkable group: unchecked, the
preferences' value stands (app/models/presets.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.models.presets import ModelPreset
from app.reply_fields import ROWS
from app.settings_check import RANGES
from engine.sampling import SamplingParams

# the sampling values the sheet shows (the rest come from the preset or the preferences unchanged)
SHOWN = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")


class PresetDialog(QDialog):
    """Edit ``preset`` for the model at ``path``; ``base`` fills the parts the preset leaves to the
    preferences, so checking a group starts from what is in use now."""

    def __init__(self, path: str, preset: ModelPreset, base: SamplingParams, n_ctx: int, n_threads: int,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Preset for {Path(path).name}")
        self._base = preset.sampling or base
        col = QVBoxLayout(self)
        intro = QLabel("What this model brings when it loads. An unchecked part keeps your preferences; a chat's "
                       "own settings still go over the preset.")
        intro.setWordWrap(True)
        col.addWidget(intro)

        self.sampling_box, form = self._group("Sampling", preset.sampling is not None)
        self.sampling: dict[str, QSpinBox | QDoubleSpinBox] = {}
        for name in SHOWN:
            value = getattr(self._base, name)
            low, high = RANGES[name]
            spin: QSpinBox | QDoubleSpinBox
            if isinstance(value, int):
                spin = QSpinBox(minimum=int(low), maximum=int(high), value=value)
            else:
                spin = QDoubleSpinBox(minimum=low, maximum=high, decimals=2, singleStep=0.05, value=value)
            label, tip = ROWS[name]
            spin.setToolTip(tip)
            self.sampling[name] = spin
            form.addRow(label, spin)

        self.ctx_box, form = self._group("Context size", preset.n_ctx is not None)
        self.n_ctx = QSpinBox(minimum=256, maximum=int(RANGES["n_ctx"][1]), singleStep=1024,
                              value=preset.n_ctx or n_ctx)
        form.addRow("Tokens", self.n_ctx)
        self.threads_box, form = self._group("Threads", preset.n_threads is not None)
        self.n_threads = QSpinBox(minimum=1, maximum=int(RANGES["n_threads"][1]), value=preset.n_threads or n_threads)
        form.addRow("CPU threads", self.n_threads)
        row = QHBoxLayout()
        row.addWidget(self.ctx_box)
        row.addWidget(self.threads_box)
        col.addWidget(self.sampling_box)
        col.addLayout(row)

        self.prompt_box, form = self._group("System prompt for new chats", preset.system_prompt is not None)
        self.system_prompt = QPlainTextEdit(preset.system_prompt or "")
        self.system_prompt.setMinimumHeight(60)
        form.addRow(self.system_prompt)
        col.addWidget(self.prompt_box, 1)
        self.template_box, form = self._group("Chat template (Jinja, over the model's own)",
                                              preset.chat_template is not None)
        self.chat_template = QPlainTextEdit(preset.chat_template or "")
        self.chat_template.setMinimumHeight(60)
        self.chat_template.setPlaceholderText("{% for message in messages %}…{% endfor %}")
        form.addRow(self.chat_template)
        col.addWidget(self.template_box, 1)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        col.addWidget(buttons)
        self.resize(520, 620)

    def _group(self, title: str, checked: bool) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        box.setCheckable(True)
        box.setChecked(checked)
        return box, QFormLayout(box)

    def preset(self) -> ModelPreset:
        """The preset as the sheet shows it."""
        sampling = replace(self._base, **{name: spin.value() for name, spin in self.sampling.items()})
        template = self.chat_template.toPlainText()
        return ModelPreset(
            sampling=sampling if self.sampling_box.isChecked() else None,
            n_ctx=self.n_ctx.value() if self.ctx_box.isChecked() else None,
            n_threads=self.n_threads.value() if self.threads_box.isChecked() else None,
            system_prompt=self.system_prompt.toPlainText() if self.prompt_box.isChecked() else None,
            chat_template=template if self.template_box.isChecked() and template.strip() else None,
        )

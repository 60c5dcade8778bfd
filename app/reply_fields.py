"""The form rows both the preferences and a chat's own settings show: how a
reply is sampled and drafted.

Labels are plain words; each tooltip gives the llama.cpp name (its server
field and command-line flag), so values can be brought from there. A preset
(Precise, Balanced, Creative) fills the sampling rows; editing a row shows
"Custom". The deepest draft offered is the engine's (``EngineClient.max_draft``,
from the worker's handshake), never a copy. With speculation on "auto" and an
autotune profile in use, the draft rows show what autotune chose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QWidget,
)

from app.reply_values import OLD_RANDOM_SEED, ReplyValues
from engine.sampling import PRESETS, RANDOM_SEED, SamplingParams
from engine.speculative.settings import SpeculativeSettings

# the sampling rows a preset fills (the seed is not one of them)
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
                 "frequency_penalty")
CUSTOM = "custom"
PRESET_LABELS = {"precise": "Precise", "balanced": "Balanced", "creative": "Creative", CUSTOM: "Custom"}
PRESET_TIPS = {
    "precise": "Always the most likely next word (greedy, llama.cpp --temp 0): the same reply every time. "
               "A light repetition penalty keeps small models from looping.",
    "balanced": "A little randomness (temperature 0.6) among the likely words, with a light repetition penalty. "
                "The default.",
    "creative": "More varied wording (temperature 1.0, every word that is at least 5% as likely as the top one).",
    CUSTOM: "Your own values below.",
}
PROBABILISTIC_DRAFTS = ("Probabilistic draft acceptance (faster at high temperature; not seed-identical)",
                        "llama.cpp --spec-draft-sampling probabilistic. With randomness above 0, the heads sample "
                        "their drafts and the model keeps each with the probability rejection sampling gives: "
                        "replies are as random as without drafting, more drafts are kept, but a fixed seed gives "
                        "another reply than without drafting. Off: drafts are kept only where they equal the "
                        "model's own choice (the same reply as without drafting).")
MAX_SPIN_SEED = 2**31 - 1  # a spin box holds 32-bit signed integers; llama.cpp seeds are 32-bit unsigned

# key: (label, tooltip) — the tooltip names llama.cpp's field and flag
ROWS: dict[str, tuple[str, str]] = {
    "sampling_preset": ("Sampling", "A starting point for the values below."),
    "temperature": ("Randomness", "temperature (llama.cpp --temp). 0 always picks the most likely word (greedy); "
                                  "higher values pick less likely words more often."),
    "top_k": ("Consider the top … words", "top_k (llama.cpp --top-k). Choose only among this many most likely "
                                          "words; 0 considers all."),
    "top_p": ("Keep likely words up to", "top_p (llama.cpp --top-p). Keep the most likely words whose chances add "
                                         "up to this share; 1 keeps all."),
    "min_p": ("Drop words less likely than", "min_p (llama.cpp --min-p). Drop words less likely than this fraction "
                                             "of the most likely word's chance; 0 drops none."),
    "repeat_penalty": ("Avoid repeating words", "repeat_penalty (llama.cpp --repeat-penalty). Makes words already in "
                                                "the recent text less likely; 1 is off, 1.1 is light."),
    "repeat_last_n": ("… within the last (tokens)", "repeat_last_n (llama.cpp --repeat-last-n). How far back the "
                                                    "penalties look, prompt included; 0 turns them off, -1 is the "
                                                    "whole context."),
    "presence_penalty": ("Avoid returning to words", "presence_penalty (llama.cpp --presence-penalty). Subtracted "
                                                     "once from every word already used; 0 is off."),
    "frequency_penalty": ("Avoid frequent words", "frequency_penalty (llama.cpp --frequency-penalty). Subtracted for "
                                                  "every time a word was used; 0 is off."),
    "seed": ("Random seed", "seed (llama.cpp --seed). 'random' draws a new one per reply; a fixed seed with the "
                            "same settings gives the same reply again."),
    "max_tokens": ("Longest reply (tokens)", "n_predict (llama.cpp --n-predict): the reply stops after this many "
                                             "tokens."),
    "speculative": ("Speculative decoding", "MTP: the model's own prediction heads draft the next few tokens and the "
                                            "full model checks them together; the reply is the same, only faster. "
                                            "auto: the autotune profile for this model and machine, else MTP. "
                                            "ngram: copy what followed the same words earlier in the conversation "
                                            "(any model, no MTP head needed; fast on text that repeats). "
                                            "mtp+ngram: both, n-gram where it has been right recently."),
    "n_max": ("Draft depth", "n_max (llama.cpp --spec-draft-n-max): the most tokens drafted per step."),
    "p_min": ("Draft confidence gate", "p_min (llama.cpp --spec-draft-p-min): stop drafting at a token the head "
                                       "is less sure of than this (0 drafts to the full depth)."),
}


def preset_for(values: Mapping[str, float]) -> str:
    """The preset whose sampling values these are, else ``custom``."""
    for name, params in PRESETS.items():
        if all(abs(float(values[k]) - float(getattr(params, k))) < 1e-9 for k in SAMPLING_KEYS):
            return name
    return CUSTOM


def _double(low: float, high: float, step: float, value: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox(minimum=low, maximum=high, singleStep=step, decimals=decimals)
    box.setValue(value)
    return box


def _beside(*widgets: QWidget) -> QWidget:
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    for w in widgets:
        layout.addWidget(w)
    layout.addStretch(1)
    return row


class ReplyFields:
    """The rows in ``form``, showing ``values``; :meth:`values` reads them back."""

    def __init__(self, form: QFormLayout, values: ReplyValues, max_draft: int,
                 auto: SpeculativeSettings | None = None, auto_speedup: float | None = None) -> None:
        sampling = values.sampling
        self.preset = QComboBox()
        for name, label in PRESET_LABELS.items():
            self.preset.addItem(label, name)
            self.preset.setItemData(self.preset.count() - 1, PRESET_TIPS[name], 3)  # 3: Qt.ToolTipRole
        self.temperature = _double(0.0, 5.0, 0.1, sampling.temperature)
        self.top_k = QSpinBox(minimum=0, maximum=100000, value=sampling.top_k)
        self.top_p = _double(0.0, 1.0, 0.05, sampling.top_p)
        self.min_p = _double(0.0, 1.0, 0.01, sampling.min_p)
        self.repeat_penalty = _double(0.5, 3.0, 0.05, sampling.repeat_penalty)
        self.repeat_last_n = QSpinBox(minimum=-1, maximum=1 << 20, value=sampling.repeat_last_n)
        self.presence_penalty = _double(-2.0, 2.0, 0.1, sampling.presence_penalty)
        self.frequency_penalty = _double(-2.0, 2.0, 0.1, sampling.frequency_penalty)
        # the box's -1 ("random") is the engine's RANDOM_SEED
        seed = OLD_RANDOM_SEED if sampling.seed == RANDOM_SEED else min(sampling.seed, MAX_SPIN_SEED)
        self.seed = QSpinBox(minimum=OLD_RANDOM_SEED, maximum=MAX_SPIN_SEED, value=seed)
        self.seed.setSpecialValueText("random")
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, value=values.max_tokens)
        self.speculative = QComboBox()
        self.speculative.addItems(["auto", "mtp", "ngram", "mtp+ngram", "off"])
        self.speculative.setCurrentText(values.speculative)
        self.n_max = QSpinBox(minimum=1, maximum=max(1, max_draft), value=values.n_max)
        self.p_min = _double(0.0, 1.0, 0.05, values.p_min)
        self.probabilistic_drafts = QCheckBox(PROBABILISTIC_DRAFTS[0])
        self.probabilistic_drafts.setChecked(bool(values.probabilistic_drafts))
        self.probabilistic_drafts.setToolTip(PROBABILISTIC_DRAFTS[1])
        self.auto_note = QLabel("")
        self.auto_note.setWordWrap(True)
        self.auto, self.auto_speedup = auto, auto_speedup
        self._own = {"n_max": values.n_max, "p_min": values.p_min}  # the user's, while auto shows autotune's
        for key, (label, tip) in ROWS.items():
            widget: QWidget = self.preset if key == "sampling_preset" else getattr(self, key)
            widget.setToolTip(tip)
            row_label = QLabel(label)
            row_label.setToolTip(tip)
            # the acceptance box shares the gate's row: a row more would push a chat's dialog past a small screen
            form.addRow(row_label, _beside(widget, self.probabilistic_drafts) if key == "p_min" else widget)
            if key == "p_min":
                form.addRow("", self.auto_note)
        self._select_preset(preset_for(asdict(sampling)))  # the values decide, not a stored name
        self.preset.currentIndexChanged.connect(self._on_preset)
        for key in SAMPLING_KEYS:
            getattr(self, key).valueChanged.connect(self._on_value)
        self.speculative.currentTextChanged.connect(self._show_auto)
        self._show_auto()

    # -- presets --------------------------------------------------------------
    def _select_preset(self, name: str) -> None:
        index = self.preset.findData(name if name in PRESET_LABELS else CUSTOM)
        self.preset.blockSignals(True)
        self.preset.setCurrentIndex(index)
        self.preset.blockSignals(False)

    def _on_preset(self) -> None:
        params = PRESETS.get(self.preset.currentData())
        if params is None:
            return
        for key in SAMPLING_KEYS:
            box = getattr(self, key)
            box.blockSignals(True)
            box.setValue(getattr(params, key))
            box.blockSignals(False)

    def _on_value(self) -> None:
        self._select_preset(preset_for(self._sampling_values()))

    def _sampling_values(self) -> dict[str, Any]:
        return {key: getattr(self, key).value() for key in SAMPLING_KEYS}

    # -- what autotune chose ----------------------------------------------------
    def _show_auto(self) -> None:
        """On "auto" with a profile, the draft rows show autotune's choice (read-only);
        elsewhere they are the user's own again."""
        applied = self.speculative.currentText() == "auto" and self.auto is not None and self.auto.enabled
        if applied and self.n_max.isEnabled():
            self._own = {"n_max": self.n_max.value(), "p_min": self.p_min.value()}
        for key in ("n_max", "p_min"):
            box = getattr(self, key)
            box.blockSignals(True)
            box.setValue(getattr(self.auto, key) if applied else self._own[key])
            box.blockSignals(False)
            box.setEnabled(not applied and self.speculative.currentText() != "off")
        self.auto_note.setText(self._auto_words())

    def _auto_words(self) -> str:
        if self.speculative.currentText() != "auto":
            return ""
        if self.auto is None:
            return "<small>No autotune profile for this model on this machine: MTP with adaptive depth, " \
                   "at most the depth above. " \
                   "Tools → Autotune measures the fastest.</small>"
        if not self.auto.enabled:
            return "<small>Autotune found speculation slower here: replies decode plainly.</small>"
        speed = f", {self.auto_speedup:.2g}× faster than without" if self.auto_speedup else ""
        gate = f" and gate {self.auto.p_min:g}" if self.auto.p_min else ""
        depth = f"adaptive draft depth (up to {self.auto.n_max})" if self.auto.adaptive \
            else f"draft depth {self.auto.n_max}"
        return f"<small>Autotune chose {depth}{gate} for this model{speed}.</small>"

    def values(self) -> ReplyValues:
        own = self._own if not self.n_max.isEnabled() and self.speculative.currentText() == "auto" \
            else {"n_max": self.n_max.value(), "p_min": self.p_min.value()}
        seed = self.seed.value()
        sampling = SamplingParams(**self._sampling_values(), seed=RANDOM_SEED if seed == OLD_RANDOM_SEED else seed)
        return ReplyValues(sampling=sampling, max_tokens=self.max_tokens.value(),
                           speculative=self.speculative.currentText(), **own,
                           probabilistic_drafts=self.probabilistic_drafts.isChecked())

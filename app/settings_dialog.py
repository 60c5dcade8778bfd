"""Preferences: engine, sampling and speculative defaults, and the theme.

OK checks the text fields first: one that is not valid text (a lone
surrogate) keeps the dialog open, with what was typed and the field named."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from app.form_buttons import add_ok_cancel, show_problem
from app.reply_fields import ReplyFields
from app.settings import Settings
from app.text_check import first_not_text, not_text_notice
from engine.hardware import default_threads, physical_cores
from engine.speculative.settings import SpeculativeSettings

# what the head may draft among (LoadOptions.draft_vocab): byte-pair vocabularies number frequent tokens first
DRAFT_VOCABS = ((0, "Every token (the model's whole vocabulary)"), (65_536, "The first 65,536 tokens"),
                (32_768, "The first 32,768 tokens"))


def threads_hint() -> str:
    """What the thread count's default is and why, in the words of the rule that
    chooses it (``engine.hardware.default_threads``), so the hint never argues
    against the number in the box."""
    cores, default = physical_cores(), default_threads()
    if cores <= 1:
        return "This machine has one core: 1 thread."
    capped = " (at most 8)" if default < cores - 1 else ""
    return (f"The default, {default} of this machine's {cores} cores{capped}, leaves a core free: when another "
            "program keeps a core busy, every thread waits for the one sharing it. On a quiet machine more threads "
            "can be faster; autotune measures it.")


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, max_draft: int, parent: QWidget | None = None,
                 auto: SpeculativeSettings | None = None, auto_speedup: float | None = None) -> None:
        """``auto``: the autotune profile's settings in use for the loaded model (and its
        measured ``auto_speedup``), shown in the draft rows while speculation is "auto"."""
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self.settings = settings
        form = QFormLayout(self)
        self.threads = QSpinBox(minimum=1, maximum=256, value=settings.n_threads)
        self.ctx = QSpinBox(minimum=256, maximum=262144, singleStep=1024, value=settings.n_ctx)
        self.gpu_layers = QSpinBox(minimum=0, maximum=999, value=settings.n_gpu_layers)
        self.theme = QComboBox()
        self.theme.addItems(["system", "light", "dark"])
        self.theme.setCurrentText(settings.theme)
        self.system_prompt = QPlainTextEdit(settings.system_prompt)
        self.system_prompt.setFixedHeight(70)
        form.addRow("CPU threads", self.threads)
        self.threads_hint = QLabel(f"<small>{threads_hint()}</small>")
        self.threads_hint.setWordWrap(True)
        form.addRow("", self.threads_hint)
        form.addRow("Context size (tokens)", self.ctx)
        form.addRow("GPU layers", self.gpu_layers)
        self.draft_vocab = QComboBox()
        for value, label in DRAFT_VOCABS:
            self.draft_vocab.addItem(label, value)
        chosen = settings.draft_vocab_for(settings.model_path)  # this model's (each model keeps its own)
        if self.draft_vocab.findData(chosen) < 0:  # a value set elsewhere (autotune, hand-edited)
            self.draft_vocab.addItem(f"The first {chosen:,} tokens", chosen)
        self.draft_vocab.setCurrentIndex(self.draft_vocab.findData(chosen))
        form.addRow("MTP drafts among", self.draft_vocab)
        hint = QLabel("<small>For this model (each model keeps its own). A head drafting among fewer tokens "
                      "drafts faster on models with a large vocabulary (150,000 tokens and more); replies are "
                      "the same, only fewer drafts may be accepted.</small>")
        hint.setWordWrap(True)
        form.addRow("", hint)
        self.state_cache = QSpinBox(minimum=0, maximum=2**20, singleStep=256, value=settings.state_cache_mib,
                                    suffix=" MiB")
        self.state_cache.setToolTip("Memory that keeps chats the engine let go of, so that going back to one "
                                    "does not read it all again. At most a quarter of the memory free once the "
                                    "model is loaded, less the model's own files; 0: keep none.")
        form.addRow("Memory for earlier chats", self.state_cache)
        self.swa_full = QCheckBox("Keep a sliding-window model's whole cache")
        self.swa_full.setChecked(settings.swa_full)
        self.swa_full.setToolTip("Gemma 3 and Step 3.5 attend to the last few hundred tokens in most layers. "
                                 "Off, those layers keep only that window (a fifth of the memory on a long "
                                 "context) and a copy of it where each prompt ended, to regenerate from. On, "
                                 "they keep every token, as llama.cpp's --swa-full, and replies decoded at once "
                                 "share a common prompt instead of each reading it.")
        form.addRow("", self.swa_full)
        self.rpc_servers = QLineEdit(settings.rpc_servers)
        self.rpc_servers.setPlaceholderText("host:port, host:port (empty: this machine only)")
        form.addRow("Remote devices (RPC)", self.rpc_servers)
        form.addRow("", QLabel("<small>Machines running <code>mtp-studio rpc-server</code> hold part of the model; "
                               "the MTP head stays here. No authentication: trusted LAN or SSH tunnel only "
                               "(docs/multi-machine.md).</small>"))
        form.addRow("Theme", self.theme)
        self.reply = ReplyFields(form, settings.reply_values(), max_draft, auto, auto_speedup)
        form.addRow("System prompt for new chats", self.system_prompt)
        self.problem = add_ok_cancel(form, self)  # why OK did not close the dialog

    def accept(self) -> None:
        bad = first_not_text({"Remote devices (RPC)": self.rpc_servers.text(),
                              "System prompt for new chats": self.system_prompt.toPlainText()})
        if bad is not None:  # the dialog stays open with what was typed
            show_problem(self.problem, not_text_notice(bad))
            return
        super().accept()

    def apply(self) -> bool:
        """Copy the values into the settings; True when the model must be reloaded."""
        s = self.settings
        reload_needed = (s.n_threads, s.n_ctx, s.n_gpu_layers, s.rpc_servers, s.draft_vocab_for(s.model_path),
                         s.state_cache_mib, s.swa_full) != (
            self.threads.value(), self.ctx.value(), self.gpu_layers.value(), self.rpc_servers.text().strip(),
            self.draft_vocab.currentData(), self.state_cache.value(), self.swa_full.isChecked())
        s.state_cache_mib = self.state_cache.value()
        s.swa_full = self.swa_full.isChecked()
        s.set_draft_vocab(s.model_path, self.draft_vocab.currentData())
        s.rpc_servers = self.rpc_servers.text().strip()
        reply = self.reply.values()
        reload_needed |= (s.speculative == "off") != (reply.speculative == "off")
        s.n_threads = self.threads.value()
        s.n_ctx = self.ctx.value()
        s.n_gpu_layers = self.gpu_layers.value()
        s.theme = self.theme.currentText()
        s.set_reply_values(reply)
        s.system_prompt = self.system_prompt.toPlainText()
        return reload_needed

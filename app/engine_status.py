"""The engine's state where the user sees it: the status bar's engine, model
and speed figures, and the banner that offers a restart when the worker died.

The text is made from what the engine reported (handshake, state, loaded
model, statistics), kept as data; nothing is read back from a label. Which
model is loaded is the model controller's to say (:meth:`EngineStatus.show_model`):
a failed load keeps the previous model, so "an error answered a load" does
not mean "nothing is loaded".
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.engine_client import EngineClient
from app.theme import Palette
from engine.speculative import stats_text
from engine.worker.events import ErrorEvent, ModelInfo, ReadyEvent, StatsEvent

STATE_WORDS = {"starting": "starting…", "ready": "ready", "loading": "loading model…",
               "busy": "generating…", "dead": "stopped unexpectedly", "stopped": "stopped"}
# Errors that mean the model asked for is not loaded, when they answer a load.
LOAD_ERRORS = ("model_file", "model_load", "sidecar_mismatch", "context", "rpc")


def is_load_error(ev: ErrorEvent) -> bool:
    """Does this error mean no model is loaded now?

    Only a final error answers a load: a generate request's errors are never
    final (it ends with ``done``), and a reply that failed, even one whose
    prompt did not fit the context (kind ``context`` too), leaves the model
    loaded and the status bar as it was.
    """
    return ev.final and ev.kind in LOAD_ERRORS


def model_text(model: ModelInfo) -> str:
    """``model.gguf · MTP: 3 heads``."""
    mtp = {"off": "no MTP", "single": "MTP: 1 head", "chained": f"MTP: {model.mtp_heads} heads"}
    return f"{Path(model.path).name} · {mtp.get(model.mtp, '')}"


def model_details(model: ModelInfo) -> str:
    """The status bar's tooltip for the model: how it was loaded, where that is not the plain default (the
    head's draft vocabulary where it is cut, the replies decoded at once where there are several)."""
    lines = [model.path]
    if model.mtp != "off" and 0 < model.draft_vocab < model.n_vocab:
        lines.append(f"The MTP head drafts among the first {model.draft_vocab:,} of {model.n_vocab:,} tokens.")
    if model.n_seq > 1:
        lines.append(f"Decodes {model.n_seq} replies at once (the chat's and the local server's).")
    if model.parallel_reason:  # "Replies at once: Auto" chose the count: say from what
        lines.append(f"Replies at once (Auto): {model.parallel_reason.replace('; --parallel N to choose', '')}")
    return "\n".join(lines)


class Banner(QFrame):
    """A coloured strip above the chat for engine failures, with an action."""

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.button = QPushButton("Restart engine")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.button)
        self.setStyleSheet(f"#banner {{ background:{palette.bad}; border-radius:6px; }}"
                           "#banner QLabel { color:white; font-weight:bold; }")
        self.hide()

    def show_message(self, text: str) -> None:
        self.label.setText(text)
        self.show()


class EngineStatus(QWidget):
    """The status bar's engine figures: the build and its state, the loaded
    model, and the reply's speed. Also owns the restart banner."""

    def __init__(self, client: EngineClient, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.state_label = QLabel("Engine: starting…")
        self.model_label = QLabel("")
        self.speed_label = QLabel("")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(16)
        row.addWidget(self.state_label)
        row.addWidget(self.model_label)
        row.addWidget(self.speed_label)
        self.banner = Banner(palette)
        self.banner.button.clicked.connect(self.restart)
        self._engine = ""  # "Engine: llama-cpp-python 0.3.36 (cpu)" once the handshake arrived
        client.sig_ready.connect(self._on_ready)
        client.sig_state.connect(self._on_state)
        client.sig_died.connect(self._on_died)
        client.sig_stats.connect(self._on_stats)

    def restart(self) -> None:
        self.banner.hide()
        self.client.restart()

    def _on_ready(self, ev: ReadyEvent) -> None:
        self.banner.hide()
        self._engine = f"Engine: llama-cpp-python {ev.engine.llama_cpp_python} ({ev.engine.backend})"
        self.state_label.setText(self._engine)

    def _on_state(self, state: str) -> None:
        known = self._engine and state in ("busy", "ready", "loading")
        self.state_label.setText(f"{self._engine if known else 'Engine'} — {STATE_WORDS.get(state, state)}")
        if state == "loading":
            self.model_label.setText("Loading model…")

    def show_model(self, model: ModelInfo | None) -> None:
        """Name the model actually loaded now (None: nothing is)."""
        self.speed_label.setText("")  # the last reply's speed was another model's
        if model is not None:
            self.model_label.setText(model_text(model))
            self.model_label.setToolTip(model_details(model))
        else:
            self.model_label.setToolTip("")
            self.model_label.setText("No engine" if self.client.state == "dead" else "No model loaded")

    def _on_died(self, reason: str) -> None:
        self.banner.show_message(f"The engine stopped: {reason}. Your conversation is safe.")
        self.model_label.setText("No engine")

    def _on_stats(self, ev: StatsEvent) -> None:
        self.speed_label.setText(stats_text.status_line(ev.stats))

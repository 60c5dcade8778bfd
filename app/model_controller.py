"""Which model the engine has loaded: loads the one the settings name, says
what it is, and applies its autotune profile.

The profile lookup hashes the model file (16 MiB read), so it runs on the
background runner; the hardware fingerprint comes from the shared probe.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app import background
from app.chat.controller import ChatController
from app.engine_client import EngineClient
from app.engine_status import is_load_error
from app.hardware_probe import HardwareProbe
from app.settings import Settings
from engine.autotune.profiles import ProfileMatch, ProfileStore
from engine.default_model import DESCRIPTION as DEFAULT_MODEL_DESCRIPTION
from engine.worker.events import ErrorEvent, LoadedEvent, ModelInfo

STALE_NOTICE = "The hardware, engine or model changed since this model was tuned: run Tools → Autotune again."


def model_notice(model: ModelInfo) -> str:
    """What the user should know about the loaded model, above the chat ("" for nothing)."""
    if model.is_default_model:
        notice = DEFAULT_MODEL_DESCRIPTION + " Open a model of your own from the Model menu."
    elif not model.has_chat_template:
        notice = "This model has no chat template: replies continue your text (plain completion)."
    else:
        notice = ""
    if model.mtp_unavailable_reason and not model.is_default_model:
        notice += (" " if notice else "") + model.mtp_unavailable_reason
    return notice


class ModelController(QObject):
    """Signals:
        sig_notice(str): the notice above the chat ("" hides it).
        sig_message(str, int): a status-bar message and how long to show it (ms).
    """

    sig_notice = Signal(str)
    sig_message = Signal(str, int)

    def __init__(self, settings: Settings, client: EngineClient, chat: ChatController, probe: HardwareProbe,
                 window: QWidget, profiles: ProfileStore | None = None) -> None:
        super().__init__(window)
        self.settings, self.client, self.chat, self.probe, self.window = settings, client, chat, probe, window
        self.profiles = profiles or ProfileStore()
        self.model: ModelInfo | None = None
        self._notice = ""
        self._lookups = 0  # a lookup that a newer load overtook is dropped
        self._task: background.Task | None = None  # keeps the running lookup's task alive
        client.sig_ready.connect(lambda _ev: self.load())
        client.sig_loaded.connect(self._on_loaded)
        client.sig_error.connect(self._on_error)
        probe.sig_report.connect(lambda _report: self.apply_profile())

    # -- what to load ---------------------------------------------------------
    def load(self) -> None:
        s = self.settings
        self.client.load(s.model_path, n_ctx=s.n_ctx, n_threads=s.n_threads, n_gpu_layers=s.n_gpu_layers,
                         mtp=s.speculative != "off", sidecar=s.sidecar_path)

    def use(self, path: str | None, sidecar: str | None) -> None:
        """Remember this target (None: the built-in model) and sidecar, and load them."""
        self.settings.model_path = path
        self.settings.sidecar_path = sidecar or None
        self.settings.save()
        self.load()

    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open a GGUF model", str(Path.home()),
                                              "GGUF models (*.gguf)")
        if path:
            self.use(path, None)

    def choose_sidecar(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Choose an MTP sidecar", str(Path.home()),
                                              "GGUF (*.gguf)")
        if path:
            self.use(self.settings.model_path, path)

    def use_default_model(self) -> None:
        self.use(None, None)

    # -- what was loaded ------------------------------------------------------
    def _on_loaded(self, ev: LoadedEvent) -> None:
        self.model = ev.model
        self.chat.model_has_mtp = ev.model.can_draft
        self.chat.model_loaded(ev.model.n_ctx)
        self._notice = model_notice(ev.model)
        self.sig_notice.emit(self._notice)
        self.apply_profile()

    def _on_error(self, ev: ErrorEvent) -> None:
        if is_load_error(ev):
            QMessageBox.warning(self.window, "Could not load the model", ev.message)

    def apply_profile(self) -> None:
        """Use the autotune profile for this model, machine and engine build, if one exists."""
        self._lookups += 1
        self.chat.profile_speculative = None
        model, fingerprint, engine = self.model, self.probe.fingerprint, self.client.engine
        if model is None or not fingerprint or engine is None or not model.can_draft:
            return
        lookup = self._lookups
        self._task = background.run(self.profiles.lookup, model.path, fingerprint, engine.key)
        self._task.sig_done.connect(lambda match: self._on_profile(match, lookup))

    def _on_profile(self, match: ProfileMatch, lookup: int) -> None:
        if lookup != self._lookups:
            return
        if match.profile is not None:
            self.chat.profile_speculative = match.profile.setting
            self.sig_message.emit(f"Using the autotune profile: {match.profile.reason}", 8000)
        elif match.stale:
            self.sig_notice.emit((self._notice + " " + STALE_NOTICE).lstrip())

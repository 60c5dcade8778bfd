"""Which model the engine has loaded: loads what the user chose, remembers it
only once it loaded, says what it is, and applies its autotune profile.

A load can fail (a missing file, an architecture llama.cpp does not know, a
context it cannot allocate). The worker keeps the previous model then (see
docs/protocol.md), so the settings must keep it too: a choice is written to
the settings file only when the worker answers ``loaded``, and a failed one
puts back the last choice that did load — otherwise "Restart engine" and the
next launch would fail the same way. The failure dialog offers the two ways
on: another file, or the built-in model.

A model's preset (app/models/presets.py) comes with it: its context and
threads go into the load when the user switches to it, and its sampling,
system prompt and chat template into the chat once it loaded.

The profile lookup hashes the model file (16 MiB read), so it runs on the
background runner; the hardware fingerprint comes from the shared probe.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QFileDialog, QMessageBox, QWidget

from app import background
from app.chat.controller import ChatController
from app.engine_client import EngineClient
from app.engine_status import is_load_error
from app.hardware_probe import HardwareProbe
from app.load_choice import LoadChoice
from app.load_sheet import LoadSheet
from app.models.presets import ModelRecords, key
from app.settings import Settings
from engine.autotune.profiles import ProfileMatch, ProfileStore
from engine.default_model import DESCRIPTION as DEFAULT_MODEL_DESCRIPTION
from engine.default_model import default_model_file
from engine.sampling import sampling_key
from engine.worker.events import ErrorEvent, LoadedEvent, ModelInfo

RECENT_MODELS = 8
# The worker's words when a late failure also lost the model it had (engine/worker/server.py _reload).
LOST_PREVIOUS = "could not be loaded again"
FAILED_TITLE = "Could not load the model"
STALE_NOTICE = "The hardware, engine or model changed since this model was tuned: run Tools → Autotune again."


def model_notice(model: ModelInfo) -> str:
    """What the user should know about the loaded model, above the chat ("" for nothing)."""
    if model.is_default_model:
        notice = DEFAULT_MODEL_DESCRIPTION + " Choose a model of your own with the Model button above the chat."
    elif not model.has_chat_template:
        notice = "This model has no chat template: replies continue your text (plain completion)."
    else:
        notice = ""
    if model.mtp_unavailable_reason and not model.is_default_model:
        notice += (" " if notice else "") + model.mtp_unavailable_reason
    return notice



def record_path(path: str | None) -> str | None:
    """The file a load's preset and last use are kept for: the model's, or the built-in model's own file (None
    in the settings), which the library lists, and offers a preset for, like any other."""
    if path:
        return path
    builtin = default_model_file()
    return str(builtin) if builtin is not None else None

class ModelController(QObject):
    """Signals:
        sig_notice(str): the notice above the chat ("" hides it).
        sig_message(str, int): a status-bar message and how long to show it (ms).
        sig_model(object): the model loaded now (ModelInfo), or None; after every load, failure, eject, crash.
        sig_loading(): a load was asked for (the picker says "Loading…").
        sig_blocked(str): why Send cannot be used now ("" when it can).
    """

    sig_notice = Signal(str)
    sig_message = Signal(str, int)
    sig_model = Signal(object)
    sig_loading = Signal()
    sig_blocked = Signal(str)

    def __init__(self, settings: Settings, client: EngineClient, chat: ChatController, probe: HardwareProbe,
                 window: QWidget, profiles: ProfileStore | None = None, records: ModelRecords | None = None) -> None:
        super().__init__(window)
        self.settings, self.client, self.chat, self.probe, self.window = settings, client, chat, probe, window
        self.profiles = profiles or ProfileStore()
        self.records = records or ModelRecords()  # each model's preset and last use (app/models/presets.py)
        self.model: ModelInfo | None = None
        self._good: LoadChoice | None = None  # the choice that loaded self.model
        self._pending: dict[str, LoadChoice] = {}  # load requests not answered yet, by id
        self.failure_box: QMessageBox | None = None  # the last failed load's dialog (non-modal)
        self.sheet: LoadSheet | None = None
        self._notice = ""
        self._lookups = 0  # a lookup that a newer load overtook is dropped
        self._task: background.Task | None = None  # keeps the running lookup's task alive
        client.sig_ready.connect(self._on_ready)
        client.sig_loaded.connect(self._on_loaded)
        client.sig_unloaded.connect(lambda _ev: self._set_model(None))
        client.sig_error.connect(self._on_error)
        client.sig_died.connect(self._on_died)
        client.sig_state.connect(lambda _state: self.sig_blocked.emit(self.send_blocked_reason()))
        probe.sig_report.connect(lambda _report: self.apply_profile())

    # -- what to load ---------------------------------------------------------
    def _on_ready(self, _ev: object) -> None:
        """A fresh worker has nothing loaded, and the old one's unanswered loads will never be answered."""
        self._pending.clear()
        self._set_model(None)
        self.load()

    def load(self) -> None:
        """Load what the settings name (at start, after a restart, after Preferences or autotune changed it)."""
        self.request(LoadChoice.from_settings(self.settings))

    def request(self, choice: LoadChoice) -> None:
        """Ask the worker to load ``choice``; the settings remember it once it loaded."""
        rid = self.client.load(choice.options(self.settings))
        self._pending[rid] = choice
        self.sig_loading.emit()

    def use(self, path: str | None, sidecar: str | None, mmproj: str | None = None) -> None:
        """Load this target (None: the built-in model), sidecar and vision projector with the current settings
        (another model's context and threads from its preset). Without ``mmproj`` the same model keeps its
        projector; another model's is never kept (a projector is made for one model)."""
        current = LoadChoice.from_settings(self.settings)
        mmproj = mmproj or (current.mmproj if path == current.path else None)
        self.request(self._with_preset(replace(current, path=path, sidecar=sidecar or None, mmproj=mmproj), current))

    def _with_preset(self, choice: LoadChoice, current: LoadChoice) -> LoadChoice:
        """``choice`` with its model's preset context and threads, when it is another model than ``current``
        (the same model keeps what was last chosen for it, in the load sheet perhaps)."""
        preset = self.records.preset(record_path(choice.path))
        if choice.path == current.path:
            return choice
        return replace(choice, n_ctx=preset.n_ctx if preset.n_ctx is not None else choice.n_ctx,
                       n_threads=preset.n_threads if preset.n_threads is not None else choice.n_threads)

    def eject(self) -> None:
        """Unload the model and free its memory; the settings keep it for the next start."""
        self.client.unload()

    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open a GGUF model", self._start_folder(),
                                              "GGUF models (*.gguf)")
        if path:
            self.open_sheet(path)

    def choose_sidecar(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Choose an MTP sidecar", self._start_folder(),
                                              "GGUF (*.gguf)")
        if path:
            self.use(self.settings.model_path, path)

    def use_default_model(self) -> None:
        self.use(None, None)

    def open_sheet(self, path: str | None = None) -> LoadSheet:
        """The load sheet for ``path`` (None: the built-in model), with the current settings.

        Window-modal but not blocking (``open``): the engine's events keep arriving while it is up."""
        current = LoadChoice.from_settings(self.settings)
        same = path == current.path
        choice = self._with_preset(replace(current, path=path, sidecar=current.sidecar if same else None,
                                           mmproj=current.mmproj if same else None), current)
        backend = self.client.engine.backend if self.client.engine is not None else None
        loaded = self._name(self.model) if self.model is not None else None
        if self.sheet is not None:
            self.sheet.close()
        sheet = self.sheet = LoadSheet(choice, backend, self.probe.report, loaded, self.window,
                                       propose_projector=not same, swa_full=self.settings.swa_full)
        sheet.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        sheet.destroyed.connect(lambda _obj=None: self._sheet_gone(sheet))
        sheet.sig_load.connect(self.request)
        sheet.sig_eject.connect(self.eject)
        sheet.open()
        return sheet

    def _sheet_gone(self, sheet: LoadSheet) -> None:
        if self.sheet is sheet:
            self.sheet = None

    def send_blocked_reason(self) -> str:
        """Why a message cannot be sent now, in words that say what to do ("" when it can)."""
        state = self.client.state
        if state == "starting":
            return "The engine is starting…"
        if state in ("dead", "stopped"):
            return "The engine is not running: restart it (Model → Restart engine)."
        if state == "loading":
            return "Loading the model…"
        if self.model is None:
            return "No model is loaded: choose one with the Model button above the chat."
        return ""

    def _start_folder(self) -> str:
        for path in (self.settings.model_path, *self.settings.recent_models):
            if path:
                return str(Path(path).parent)
        return str(Path.home())

    @staticmethod
    def _name(model: ModelInfo) -> str:
        return "the built-in model" if model.is_default_model else Path(model.path).name

    # -- what was loaded ------------------------------------------------------
    def _set_model(self, model: ModelInfo | None) -> None:
        self.model = model
        self.chat.set_model(model)
        if model is None:
            self._good = None
            self._notice = ""
            self.sig_notice.emit("")
        self.sig_model.emit(model)
        self.sig_blocked.emit(self.send_blocked_reason())

    def _on_loaded(self, ev: LoadedEvent) -> None:
        choice = self._pending.pop(ev.id, None) or LoadChoice.from_settings(self.settings)
        self._good = choice
        self._remember(choice)
        path = record_path(choice.path)  # the built-in model's too: the library lists its file with the others
        if path:
            self.records.mark_used(path)  # the library's "last used"; a refused write costs only that
        self.chat.model_preset = self.records.preset(path)
        self.chat.model_has_mtp = ev.model.can_draft
        self.chat.model_loaded(ev.model.n_ctx)
        self._set_model(ev.model)
        self._notice = model_notice(ev.model)
        self.sig_notice.emit(self._notice)
        self.apply_profile()

    def _remember(self, choice: LoadChoice) -> None:
        """Write the choice that loaded to the settings file, and put it first among the recent models."""
        choice.apply_to(self.settings)
        if choice.path:
            recent = [choice.path] + [p for p in self.settings.recent_models if p != choice.path]
            self.settings.recent_models[:] = recent[:RECENT_MODELS]
        self.settings.try_save()  # on a full disk: kept in memory, saved at quit

    def _on_error(self, ev: ErrorEvent) -> None:
        if not is_load_error(ev):
            return
        self._pending.pop(ev.id or "", None)
        kept = self.model is not None and LOST_PREVIOUS not in ev.message
        self._forget_failed_choice()
        self._set_model(self.model if kept else None)
        self._show_failure(ev.message)

    def _on_died(self, _reason: str) -> None:
        self._pending.clear()
        self._forget_failed_choice()  # a load that killed the worker must not be tried again at the next start
        self._set_model(None)

    def preset_saved(self, path: str) -> None:
        """A model's preset changed: the loaded model's applies to the next reply (context and threads at its
        next load)."""
        loaded = record_path(self._good.path) if self._good is not None else None
        if loaded and key(path) == key(loaded):
            self.chat.model_preset = self.records.preset(path)

    def save_chat_as_preset(self) -> None:
        """Keep the open chat's sampling and system prompt as the loaded model's preset (Model menu)."""
        path = record_path(self._good.path) if self._good is not None else None
        if not path:
            self.sig_message.emit("No model is loaded: its preset cannot be saved.", 6000)
            return
        chat = self.chat
        prompt = chat.store.get(chat.conversation_id).system_prompt if chat.conversation_id is not None else None
        preset = replace(self.records.preset(path), sampling=chat.chat_values().sampling,
                         system_prompt=prompt if prompt is not None else self.records.preset(path).system_prompt)
        problem = self.records.set_preset(path, preset)
        chat.model_preset = preset
        self.sig_message.emit(f"Not saved ({problem}); the preset applies until MTP Studio quits." if problem
                              else f"This chat's settings are now the preset of {Path(path).name}.", 8000)

    def _forget_failed_choice(self) -> None:
        """Put back the last choice that loaded (Preferences or autotune may have written another)."""
        good = self._good
        if good is not None and good != LoadChoice.from_settings(self.settings):
            good.apply_to(self.settings)
            self.settings.try_save()  # on a full disk: kept in memory, saved at quit

    def _show_failure(self, message: str) -> None:
        """Say what failed, what is loaded now, and offer the two ways on (not blocking: see open_sheet)."""
        box = QMessageBox(QMessageBox.Icon.Warning, FAILED_TITLE, message, parent=self.window)
        if self.model is not None:
            name = "The built-in model" if self.model.is_default_model else Path(self.model.path).name
            box.setInformativeText(f"{name} is still loaded.")
        else:
            box.setInformativeText("No model is loaded now: choose another file, or use the built-in model.")
        choose = box.addButton("Choose another file…", QMessageBox.ButtonRole.ActionRole)
        builtin = box.addButton("Use the built-in model", QMessageBox.ButtonRole.ActionRole)
        close = box.addButton(f"Keep {self._name(self.model)}" if self.model is not None else "Close",
                              QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(close)
        box.buttonClicked.connect(lambda button: self._on_failure_choice(button, choose, builtin))
        if self.failure_box is not None:
            self.failure_box.close()
        self.failure_box = box
        box.open()

    def _on_failure_choice(self, button: object, choose: object, builtin: object) -> None:
        if button is choose:
            self.choose_model()
        elif button is builtin:
            self.use_default_model()

    def apply_profile(self) -> None:
        """Use the autotune profile for this model, machine and engine build, if one exists."""
        self._lookups += 1
        self.chat.profile_speculative = None
        model, fingerprint, engine = self.model, self.probe.fingerprint, self.client.engine
        if model is None or not fingerprint or engine is None or not model.can_draft:
            return
        lookup = self._lookups
        # the profile measured with the sampling replies get by default (the model's preset, else the
        # preferences'), else another sampling's: a best guess, whose speedup the panel does not claim
        sampling = self.chat.model_preset.sampling or self.settings.sampling
        self._task = background.run(self.profiles.lookup, model.path, fingerprint, engine.key, sampling_key(sampling))
        self._task.sig_done.connect(lambda match: self._on_profile(match, lookup))

    def _on_profile(self, match: ProfileMatch, lookup: int) -> None:
        if lookup != self._lookups:
            return
        if match.profile is not None:
            self.chat.profile_speculative = match.profile.setting
            self.chat.profile_speedup = match.profile.speedup  # the panel states it: it was measured
            self.chat.profile_sampling = match.profile.sampling  # … for replies with this sampling
            self.sig_message.emit(f"Using the autotune profile: {match.profile.reason}", 8000)
            if match.profile.outdated:  # still valid; say what it did not try
                self.sig_notice.emit(f"This model's autotune profile was {match.profile.outdated_text} "
                                     "(Tools → Autotune).")
        elif match.stale:
            self.sig_notice.emit((self._notice + " " + STALE_NOTICE).lstrip())

"""The main window: conversations on the left, the chat in the middle, live
statistics on the right, engine state in the status bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.chat.controller import ChatController
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore
from app.chat.transcript import TranscriptView
from app.engine_client import EngineClient
from app.hardware_page import HardwarePage
from app.models_page import ModelsPage
from app.settings import Settings
from app.settings_dialog import SettingsDialog
from app.theme import Palette, apply_qt_palette, palette_for
from engine.default_model import DESCRIPTION as DEFAULT_MODEL_DESCRIPTION


class Composer(QPlainTextEdit):
    """The input box: Enter sends, Shift+Enter starts a new line.

    Signals:
        sig_submit(): the user pressed Enter.
    """

    sig_submit = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.sig_submit.emit()
            return
        super().keyPressEvent(event)


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


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings, store: ConversationStore, client: EngineClient) -> None:
        super().__init__()
        self.settings = settings
        self.store = store
        self.client = client
        self.model_facts: dict[str, Any] = {}
        self.hardware_fingerprint: str | None = None
        self.palette_ = palette_for(settings.theme)
        apply_qt_palette(self.palette_)
        self.setWindowTitle("MTP Studio")
        self.resize(1280, 800)

        self.transcript = TranscriptView(self.palette_)
        self.stats_panel = StatsPanel(self.palette_)
        self.chat = ChatController(store, client, self.transcript, self.stats_panel, settings)
        self._build_ui()
        self._build_menus()
        self._connect()
        self.refresh_conversations()
        convs = store.list()
        if convs:
            self.chat.open(convs[0].id)
            self._select_conversation(convs[0].id)
        if store.recovered:
            self.statusBar().showMessage(
                f"{store.recovered} reply(ies) were interrupted last time; they are kept and marked.", 8000)

    # -- layout ---------------------------------------------------------------
    def _build_ui(self) -> None:
        p = self.palette_
        sidebar = QWidget()
        side = QVBoxLayout(sidebar)
        side.setContentsMargins(8, 8, 4, 8)
        self.new_button = QPushButton("+  New chat")
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.conversations = QListWidget()
        self.conversations.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.conversations.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversations.setTextElideMode(Qt.TextElideMode.ElideRight)
        side.addWidget(self.new_button)
        side.addWidget(self.search)
        side.addWidget(self.conversations, 1)

        center = QWidget()
        col = QVBoxLayout(center)
        col.setContentsMargins(4, 8, 4, 8)
        self.banner = Banner(p)
        self.model_notice = QLabel()
        self.model_notice.setWordWrap(True)
        self.model_notice.setStyleSheet(f"color:{p.muted}; padding:2px 4px;")
        self.composer = Composer()
        self.composer.setPlaceholderText("Message the model — Enter sends, Shift+Enter for a new line")
        self.composer.setFixedHeight(84)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.regen_button = QPushButton("Regenerate")
        self.edit_button = QPushButton("Edit last")
        buttons = QHBoxLayout()
        buttons.addWidget(self.regen_button)
        buttons.addWidget(self.edit_button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        col.addWidget(self.banner)
        col.addWidget(self.model_notice)
        col.addWidget(self.transcript, 1)
        col.addWidget(self.composer)
        col.addLayout(buttons)

        right = QWidget()
        rcol = QVBoxLayout(right)
        rcol.setContentsMargins(4, 8, 8, 8)
        self.highlight_box = QCheckBox("Highlight text from accepted drafts")
        self.highlight_box.setChecked(self.settings.highlight_drafts)
        rcol.addWidget(self.stats_panel, 1)
        rcol.addWidget(self.highlight_box)

        splitter = QSplitter()
        splitter.addWidget(sidebar)
        splitter.addWidget(center)
        splitter.addWidget(right)
        splitter.setSizes([230, 720, 300])
        splitter.setStretchFactor(1, 1)
        self.models_page = ModelsPage()
        self.hardware_page = HardwarePage()
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(splitter, "Chat")
        self.tabs.addTab(self.models_page, "Models")
        self.tabs.addTab(self.hardware_page, "Hardware")
        self.setCentralWidget(self.tabs)

        self.state_label = QLabel("Engine: starting…")
        self.model_label = QLabel("")
        self.speed_label = QLabel("")
        self.statusBar().addPermanentWidget(self.model_label)
        self.statusBar().addPermanentWidget(self.speed_label)
        self.statusBar().addWidget(self.state_label)

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self._action(file_menu, "New chat", self.new_chat, QKeySequence.StandardKey.New)
        self._action(file_menu, "This chat's settings…", self.open_chat_settings)
        self._action(file_menu, "Export as Markdown…", lambda: self.export("md"))
        self._action(file_menu, "Export as JSON…", lambda: self.export("json"))
        file_menu.addSeparator()
        self._action(file_menu, "Quit", self.close, QKeySequence.StandardKey.Quit)
        model_menu = self.menuBar().addMenu("&Model")
        self._action(model_menu, "Open GGUF model…", self.choose_model, QKeySequence.StandardKey.Open)
        self._action(model_menu, "Choose MTP sidecar…", self.choose_sidecar)
        self._action(model_menu, "Use the built-in default model", self.use_default_model)
        model_menu.addSeparator()
        self._action(model_menu, "Restart engine", self.restart_engine)
        tools_menu = self.menuBar().addMenu("&Tools")
        self._action(tools_menu, "Autotune speculative decoding…", self.open_autotune)
        settings_menu = self.menuBar().addMenu("&Settings")
        self._action(settings_menu, "Preferences…", self.open_settings, QKeySequence.StandardKey.Preferences)

    def _action(self, menu: QMenu, text: str, slot: Any, shortcut: Any = None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _connect(self) -> None:
        self.new_button.clicked.connect(self.new_chat)
        self.search.textChanged.connect(lambda _t: self.refresh_conversations())
        self.conversations.itemClicked.connect(self._on_conversation_clicked)
        self.conversations.customContextMenuRequested.connect(self._conversation_menu)
        self.composer.sig_submit.connect(self.send)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.chat.stop)
        self.regen_button.clicked.connect(self.chat.regenerate)
        self.edit_button.clicked.connect(self._edit_last)
        self.highlight_box.toggled.connect(self._set_highlight)
        self.banner.button.clicked.connect(self.restart_engine)
        self.chat.sig_reply_started.connect(self._on_reply_started)
        self.chat.sig_reply_finished.connect(self._on_reply_finished)
        self.chat.sig_notice.connect(lambda text: self.statusBar().showMessage(text, 10000))
        self.client.sig_ready.connect(self._on_engine_ready)
        self.client.sig_loaded.connect(self._on_loaded)
        self.client.sig_error.connect(self._on_engine_error)
        self.client.sig_died.connect(self._on_engine_died)
        self.client.sig_state.connect(self._on_state)
        self.client.sig_stats.connect(self._on_stats)
        self.transcript.sig_copied.connect(lambda _c: self.statusBar().showMessage("Code copied", 2000))
        self._set_highlight(self.settings.highlight_drafts)
        self.models_page.sig_use_model.connect(self._use_model)
        self.tabs.currentChanged.connect(self._on_tab)

    def _on_tab(self, index: int) -> None:
        page = self.tabs.widget(index)
        if page is self.hardware_page and self.hardware_page.report is None:
            self.hardware_page.refresh()
        elif page is self.models_page and not self.models_page.library.count():
            self.models_page.refresh_library()

    def _use_model(self, path: str, sidecar: str) -> None:
        self.settings.model_path = path
        self.settings.sidecar_path = sidecar or None
        self.settings.save()
        self.load_model()
        self.tabs.setCurrentIndex(0)

    # -- conversations --------------------------------------------------------
    def refresh_conversations(self) -> None:
        current = self.chat.conversation_id
        self.conversations.clear()
        for conv in self.store.list(self.search.text().strip()):
            item = QListWidgetItem(conv.title)
            item.setData(Qt.ItemDataRole.UserRole, conv.id)
            self.conversations.addItem(item)
        if current is not None:
            self._select_conversation(current)

    def _select_conversation(self, conversation_id: int) -> None:
        for i in range(self.conversations.count()):
            item = self.conversations.item(i)
            if item.data(Qt.ItemDataRole.UserRole) == conversation_id:
                self.conversations.setCurrentItem(item)

    def _on_conversation_clicked(self, item: QListWidgetItem) -> None:
        if self.chat.busy:
            self.statusBar().showMessage("Stop the reply first to switch conversations.", 4000)
            self._select_conversation(self.chat.conversation_id or -1)
            return
        self.chat.open(int(item.data(Qt.ItemDataRole.UserRole)))

    def _conversation_menu(self, pos: Any) -> None:
        item = self.conversations.itemAt(pos)
        if item is None:
            return
        conv_id = int(item.data(Qt.ItemDataRole.UserRole))
        menu = QMenu(self)
        menu.addAction("Rename…", lambda: self.rename(conv_id))
        menu.addAction("Export as Markdown…", lambda: self.export("md", conv_id))
        menu.addAction("Export as JSON…", lambda: self.export("json", conv_id))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete(conv_id))
        menu.exec(self.conversations.mapToGlobal(pos))

    def new_chat(self) -> None:
        if self.chat.busy:
            return
        self.chat.new_conversation()
        self.refresh_conversations()
        self.composer.setFocus()

    def rename(self, conv_id: int) -> None:
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=self.store.get(conv_id).title)
        if ok and title.strip():
            self.store.update(conv_id, title=title.strip())
            self.refresh_conversations()

    def delete(self, conv_id: int) -> None:
        if self.chat.busy and conv_id == self.chat.conversation_id:
            return
        self.store.delete(conv_id)
        if conv_id == self.chat.conversation_id:
            self.chat.conversation_id = None
            self.transcript.set_messages([])
            self.stats_panel.reset()
        self.refresh_conversations()

    def export(self, fmt: str, conv_id: int | None = None) -> None:
        conv_id = conv_id if conv_id is not None else self.chat.conversation_id
        if conv_id is None:
            return
        title = self.store.get(conv_id).title
        suggested = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"
        path, _ = QFileDialog.getSaveFileName(self, "Export conversation", f"{suggested}.{fmt}")
        if not path:
            return
        text = (self.store.export_markdown(conv_id) if fmt == "md"
                else json.dumps(self.store.export_json(conv_id), indent=2, ensure_ascii=False))
        Path(path).write_text(text, encoding="utf-8")
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    # -- chat -------------------------------------------------------------------
    def send(self) -> None:
        if self.client.state not in ("ready",):
            self.statusBar().showMessage("The engine is not ready yet.", 3000)
            return
        if self.chat.send(self.composer.toPlainText()):
            self.composer.clear()
            self.refresh_conversations()

    def _edit_last(self) -> None:
        text = self.chat.edit_last_user_message()
        if text:
            self.composer.setPlainText(text)
            self.composer.setFocus()

    def _set_highlight(self, on: bool) -> None:
        self.settings.highlight_drafts = on
        self.transcript.highlight_drafts = on
        self.transcript.rerender()

    def _on_reply_started(self) -> None:
        self.stop_button.setEnabled(True)
        self.send_button.setEnabled(False)
        self.regen_button.setEnabled(False)
        self.edit_button.setEnabled(False)

    def _on_reply_finished(self, _status: str) -> None:
        self.stop_button.setEnabled(False)
        self.send_button.setEnabled(True)
        self.regen_button.setEnabled(True)
        self.edit_button.setEnabled(True)
        self.refresh_conversations()

    def _on_stats(self, _rid: str, stats: dict[str, Any]) -> None:
        tps = stats.get("decode_tps")
        text = f"{tps:.1f} tok/s" if tps else ""
        if stats.get("rounds"):
            text += f" · MTP {100 * (stats.get('acceptance_rate') or 0):.0f}% accepted"
        self.speed_label.setText(text)

    # -- engine -----------------------------------------------------------------
    def load_model(self) -> None:
        s = self.settings
        self.model_label.setText("Loading model…")
        self.client.load(s.model_path, n_ctx=s.n_ctx, n_threads=s.n_threads, n_gpu_layers=s.n_gpu_layers,
                         mtp=s.speculative != "off", sidecar=s.sidecar_path)

    def _on_engine_ready(self, hello: dict[str, Any]) -> None:
        self.banner.hide()
        engine = hello.get("engine", {})
        self.state_label.setText(f"Engine: llama-cpp-python {engine.get('llama_cpp_python')} "
                                 f"({engine.get('backend')})")
        self.load_model()

    def _on_loaded(self, _rid: str, facts: dict[str, Any]) -> None:
        self.model_facts = facts
        self.chat.model_has_mtp = facts.get("mtp", "off") != "off"
        name = Path(facts["path"]).name
        mtp = {"off": "no MTP", "single": "MTP: 1 head", "chained": f"MTP: {facts.get('mtp_heads')} heads"}
        self.model_label.setText(f"{name} · {mtp.get(facts.get('mtp', 'off'), '')}")
        if facts.get("is_default_model"):
            notice = DEFAULT_MODEL_DESCRIPTION + " Open a model of your own from the Model menu."
        elif not facts.get("has_chat_template"):
            notice = "This model has no chat template: replies continue your text (plain completion)."
        else:
            notice = ""
        if facts.get("mtp_unavailable_reason") and not facts.get("is_default_model"):
            notice += (" " if notice else "") + facts["mtp_unavailable_reason"]
        self.model_notice.setText(notice)
        self.model_notice.setVisible(bool(notice))
        self.apply_profile(facts)

    def apply_profile(self, facts: dict[str, Any]) -> None:
        """Use the autotune profile for this model, machine and engine build, if one exists."""
        from engine.autotune.profiles import ProfileStore, model_identity

        fingerprint = self.hardware_fingerprint
        self.chat.profile_speculative = None
        if not fingerprint or facts.get("mtp", "off") == "off":
            return
        engine = str(self.client.engine_info.get("cache_key") or self.client.engine_info.get("llama_cpp_python"))
        store = ProfileStore()
        model_hash = model_identity(facts["path"])
        profile = store.find(fingerprint, model_hash, engine)
        if profile is not None:
            self.chat.profile_speculative = profile.setting
            self.statusBar().showMessage(f"Using the autotune profile: {profile.reason}", 8000)
        elif store.stale_for(facts["path"], fingerprint, model_hash, engine):
            self.model_notice.setText((self.model_notice.text() + " ").lstrip() +
                                      "The hardware, engine or model changed since this model was tuned: "
                                      "run Tools → Autotune again.")
            self.model_notice.show()

    def _on_engine_error(self, _rid: str, kind: str, message: str) -> None:
        if kind in ("model_file", "model_load", "sidecar_mismatch", "context"):
            self.model_label.setText("No model loaded")
            QMessageBox.warning(self, "Could not load the model", message)

    def _on_engine_died(self, reason: str) -> None:
        self.banner.show_message(f"The engine stopped: {reason}. Your conversation is safe.")
        self.model_label.setText("No engine")

    def _on_state(self, state: str) -> None:
        words = {"starting": "starting…", "ready": "ready", "loading": "loading model…",
                 "busy": "generating…", "dead": "stopped unexpectedly", "stopped": "stopped"}
        prefix = self.state_label.text().split(" — ")[0] if state in ("busy", "ready", "loading") else "Engine"
        self.state_label.setText(f"{prefix} — {words.get(state, state)}")

    def restart_engine(self) -> None:
        self.banner.hide()
        self.client.restart()

    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", str(Path.home()), "GGUF models (*.gguf)")
        if path:
            self.settings.model_path = path
            self.settings.sidecar_path = None
            self.settings.save()
            self.load_model()

    def choose_sidecar(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose an MTP sidecar", str(Path.home()), "GGUF (*.gguf)")
        if path:
            self.settings.sidecar_path = path
            self.settings.save()
            self.load_model()

    def use_default_model(self) -> None:
        self.settings.model_path = None
        self.settings.sidecar_path = None
        self.settings.save()
        self.load_model()

    def open_chat_settings(self) -> None:
        from app.chat.chat_settings import ChatSettingsDialog

        if self.chat.conversation_id is None:
            self.chat.new_conversation()
            self.refresh_conversations()
        conv = self.store.get(self.chat.conversation_id)
        dialog = ChatSettingsDialog(self.chat.chat_values(), conv.system_prompt, self)
        if dialog.exec():
            self.store.update(conv.id, settings=dialog.values(), system_prompt=dialog.system_prompt.toPlainText())

    def open_autotune(self) -> None:
        from app.autotune_wizard import AutotuneWizard

        wizard = AutotuneWizard(self.settings, self.palette_, self)
        if wizard.exec():
            self.load_model()

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec():
            reload_needed = dialog.apply()
            self.settings.save()
            if reload_needed:
                self.load_model()

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.chat.busy:
            self.chat.stop()
        self.models_page.shutdown()
        self.settings.save()
        event.accept()

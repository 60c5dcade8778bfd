"""The main window: conversations on the left, the chat in the middle, live
statistics on the right, engine state in the status bar.

It builds the widgets and controllers and wires them; what happens lives in
them (conversations, chat, model loading, engine status).

Closing the window is the last chance to save: a reply still waiting for disk
space is written once more, and so are the preferences; if the disk still
refuses, a dialog says what would be lost and offers Retry (after freeing
space), Quit without saving, or Cancel (the app stays open and keeps retrying).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QMainWindow,
    QMenu,
    QMessageBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.chat.chat_pane import ChatPane
from app.chat.controller import ChatController
from app.chat.message_actions import MessageActions, UndoBar
from app.chat.reply_saver import refusal
from app.chat.stats_panel import StatsPanel, scrolled
from app.chat.store import ConversationStore, DiskFull, NotSaved
from app.chat.transcript import TranscriptView
from app.conversations import ConversationController, ConversationListModel, ConversationSidebar
from app.engine_client import EngineClient
from app.engine_status import EngineStatus
from app.file_notice import FileNotice
from app.hardware_page import HardwarePage
from app.hardware_probe import HardwareProbe
from app.model_controller import ModelController
from app.model_picker import ModelPicker
from app.models_page import ModelsPage
from app.reply_values import ReplyValues, stored
from app.server_status import ServerStatus
from app.settings import Settings
from app.settings_dialog import SettingsDialog
from app.status_bar import StatusBar
from app.theme import apply_qt_palette, palette_for
from app.window_extras import apply_theme, install_window_extras, save_window_state


class MainWindow(QMainWindow):
    def __init__(self, settings: Settings, store: ConversationStore, client: EngineClient,
                 probe: HardwareProbe, notices: Sequence[str] = ()) -> None:
        """``notices``: what the user must hear about files read at start (set aside, reset)."""
        super().__init__()
        self.settings, self.store, self.client, self.probe = settings, store, client, probe
        self.palette_ = palette_for(settings.theme)
        apply_qt_palette(self.palette_)
        self.setWindowTitle("MTP Studio")
        self.resize(1280, 800)

        self.transcript = TranscriptView(self.palette_)
        self.stats_panel = StatsPanel(self.palette_)
        self.chat = ChatController(store, client, self.transcript, self.stats_panel, settings)
        self.engine_status = EngineStatus(client, self.palette_)
        self.banner = self.engine_status.banner
        self.file_notice = FileNotice(self.palette_)
        self.models = ModelController(settings, client, self.chat, probe, self)
        self._build_ui()
        self._build_menus()
        self._connect()
        install_window_extras(self)  # shortcuts, remembered size, the OS's theme followed
        self._install_message_actions()
        self.conversation_list.open_latest()
        self.file_notice.show_notices(notices)
        if store.recovered:
            self._message(f"{store.recovered} reply(ies) were interrupted last time; they are kept and marked.",
                          8000)

    # -- layout ---------------------------------------------------------------
    def _build_ui(self) -> None:
        model = ConversationListModel(self.store, self)
        self.sidebar = ConversationSidebar(model)
        self.conversations = self.sidebar.list
        self.conversation_list = ConversationController(self.store, self.chat, self.sidebar, model)
        self.model_picker = ModelPicker(self.settings.recent_models)
        self.undo_bar = UndoBar(self.palette_)  # "Message deleted. [Undo]"
        self.chat_pane = ChatPane(self.chat, self.transcript, self.models.send_blocked_reason, self.palette_,
                                  above=[self.model_picker, self.banner, self.file_notice, self.undo_bar])
        self.composer = self.chat_pane.composer
        self.send_button = self.chat_pane.send_button
        self.stop_button = self.chat_pane.stop_button

        right = QWidget()
        rcol = QVBoxLayout(right)
        rcol.setContentsMargins(4, 8, 8, 8)
        self.highlight_box = QCheckBox("Highlight text from accepted drafts")
        self.highlight_box.setChecked(self.settings.highlight_drafts)
        rcol.addWidget(scrolled(self.stats_panel), 1)  # a short window scrolls it, never cuts it
        rcol.addWidget(self.highlight_box)

        self.splitter = splitter = QSplitter()
        for widget in (self.sidebar, self.chat_pane, right):
            splitter.addWidget(widget)
        splitter.setSizes([230, 720, 300])
        splitter.setStretchFactor(1, 1)
        self.models_page = ModelsPage(n_ctx=self.settings.n_ctx, records=self.models.records)
        self.models_page.library.preferences = self.settings
        self.models_page.library.fingerprint = lambda: self.probe.fingerprint  # the library's autotune column
        self.hardware_page = HardwarePage(self.probe)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(splitter, "Chat")
        self.tabs.addTab(self.models_page, "Models")
        self.tabs.addTab(self.hardware_page, "Hardware")
        self.setCentralWidget(self.tabs)
        self.setStatusBar(StatusBar())  # its messages stop short of the fixed labels
        self.server_status = ServerStatus(self.open_server_panel)
        self.statusBar().addPermanentWidget(self.server_status)
        self.statusBar().addPermanentWidget(self.engine_status)

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self._action(file_menu, "New chat", self.conversation_list.new_chat, QKeySequence.StandardKey.New)
        self._action(file_menu, "This chat's settings…", self.open_chat_settings)
        self._action(file_menu, "Export…", lambda: self.conversation_list.export("md"))  # Markdown, JSON or text
        file_menu.addSeparator()
        self._action(file_menu, "Quit", self.close, QKeySequence.StandardKey.Quit)
        model_menu = self.menuBar().addMenu("&Model")
        self._action(model_menu, "Open GGUF model…", self.models.choose_model, QKeySequence.StandardKey.Open)
        self._action(model_menu, "Choose MTP sidecar…", self.models.choose_sidecar)
        self._action(model_menu, "Use the built-in default model", self.models.use_default_model)
        self._action(model_menu, "Load settings (context, threads, memory)…",
                     lambda: self.models.open_sheet(self.settings.model_path))
        self._action(model_menu, "Reload", self.models.load)  # what the settings name: a load setting changed
        self._action(model_menu, "Eject model", self.models.eject)
        self._action(model_menu, "Save this chat's settings as the model's preset", self.models.save_chat_as_preset)
        model_menu.addSeparator()
        self._action(model_menu, "Restart engine", self.engine_status.restart)
        tools_menu = self.menuBar().addMenu("&Tools")
        self._action(tools_menu, "Autotune speculative decoding…", self.open_autotune)
        self._action(tools_menu, "Local server (OpenAI-compatible API)…", self.open_server_panel)
        settings_menu = self.menuBar().addMenu("&Settings")
        self._action(settings_menu, "Preferences…", self.open_settings, QKeySequence.StandardKey.Preferences)

    def _action(self, menu: QMenu, text: str, slot: Callable[[], object],
                shortcut: QKeySequence.StandardKey | None = None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(shortcut)
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def _install_message_actions(self) -> None:
        """Each message's Copy, Delete (undone by the bar or Chat → Undo delete, Ctrl+Z) and Fork."""
        self.message_actions = actions = MessageActions(self.chat, self.conversation_list, self)
        actions.sig_message.connect(self._message)
        self.undo_bar.follow(actions.deletions)
        self.undo_bar.sig_undo.connect(actions.undo)
        chat_menu = next(a.menu() for a in self.menuBar().actions() if a.text() == "&Chat")
        chat_menu.addSeparator()
        self.undo_delete = self._action(chat_menu, "Undo delete", actions.undo, QKeySequence.StandardKey.Undo)
        self.undo_delete.setEnabled(False)
        actions.deletions.sig_changed.connect(lambda: self.undo_delete.setEnabled(bool(actions.deletions.undoable)))
        restored = actions.deletions.restore_leftovers()
        if restored:
            self._message(f"{restored} message(s) deleted just before MTP Studio stopped were brought back.", 8000)

    def _connect(self) -> None:
        for source in (self.conversation_list, self.chat_pane, self.models):
            source.sig_message.connect(self._message)
        self.conversation_list.sig_opened.connect(self.show_chat)  # Ctrl+N from any page shows the new chat
        self.chat_pane.sig_sent.connect(self.conversation_list.refresh)
        self.chat.sig_notice.connect(lambda text: self._message(text, 10000))
        self.models.sig_notice.connect(self.chat_pane.show_notice)
        self.models.sig_model.connect(self.engine_status.show_model)
        self.models.sig_model.connect(self.model_picker.show_model)
        self.models.sig_model.connect(lambda m: m is not None and self.models_page.follow_chat_context(m.n_ctx))
        self.models.sig_loading.connect(lambda: self.model_picker.show_model(None, loading=True))
        self.models.sig_blocked.connect(self.chat_pane.set_blocked)
        self.chat_pane.set_blocked(self.models.send_blocked_reason())
        self.model_picker.sig_pick.connect(self.models.open_sheet)
        self.model_picker.sig_open.connect(self.models.choose_model)
        self.model_picker.sig_eject.connect(self.models.eject)
        self.models_page.library.sig_rows.connect(self.model_picker.set_library)  # the picker searches the library
        self.model_picker.sig_library_wanted.connect(self.models_page.refresh_library)
        self.transcript.sig_copied.connect(lambda _code: self._message("Code copied", 2000))
        self.transcript.sig_system_prompt.connect(self.open_chat_settings)
        self.highlight_box.toggled.connect(self._set_highlight)
        self._set_highlight(self.settings.highlight_drafts)
        self.models_page.sig_use_model.connect(self._use_model)
        self.models_page.sig_preset.connect(self.models.preset_saved)
        self.tabs.currentChanged.connect(self._on_tab)

    def show_chat(self) -> None:
        """The Chat page, with the focus in the message box."""
        self.tabs.setCurrentIndex(0)
        self.composer.setFocus()

    def _message(self, text: str, ms: int) -> None:
        self.statusBar().showMessage(text, ms)

    def _on_tab(self, index: int) -> None:
        page = self.tabs.widget(index)
        if page is self.hardware_page and self.hardware_page.report is None:
            self.hardware_page.show_report()
        elif page is self.models_page and not self.models_page.library.entries.count():
            self.models_page.refresh_library()

    def _use_model(self, path: str, sidecar: str, mmproj: str = "") -> None:
        self.models.use(path, sidecar, mmproj or None)
        self.tabs.setCurrentIndex(0)

    def _set_highlight(self, on: bool) -> None:
        self.settings.highlight_drafts = on
        self.transcript.highlight_drafts = on
        self.transcript.rerender()

    def send(self) -> None:
        self.chat_pane.send()

    # -- dialogs ----------------------------------------------------------------
    def open_chat_settings(self) -> None:
        from app.chat.chat_settings import ChatSettingsDialog

        conv_id = self.conversation_list.ensure_conversation()
        if conv_id is None:  # the disk refused a new chat; the status bar says so
            return
        conv = self.store.get(conv_id)

        def save(values: ReplyValues, system_prompt: str) -> str:
            try:
                self.store.update(conv.id, settings=stored(values), system_prompt=system_prompt)
            except NotSaved as exc:
                return refusal(exc, "these settings were not saved. Free some space and press OK again, "
                                    "or Cancel to leave them as they were.")
            if self.chat.conversation_id == conv.id:  # shown above the messages
                self.transcript.system_prompt = system_prompt
                self.transcript.rerender()
            return ""

        dialog = ChatSettingsDialog(self.chat.chat_values(), conv.system_prompt, self.client.max_draft, self,
                                    auto=self.chat.profile_speculative, auto_speedup=self.chat.profile_speedup,
                                    save=save)
        dialog.exec()  # OK saves (and stays open while it cannot)

    def open_autotune(self) -> None:
        from app.autotune_wizard import AutotuneWizard

        if AutotuneWizard(self.settings, self.palette_, self.probe, self, sampling=self.chat.chat_values().sampling
                          ).exec():
            self.models.load()

    def open_server_panel(self) -> None:
        from app.server_panel import open_panel

        self.server_status.follow(open_panel(self))

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self.client.max_draft, self, auto=self.chat.profile_speculative,
                                auto_speedup=self.chat.profile_speedup)
        if dialog.exec():
            reload_needed = dialog.apply()
            apply_theme(self)  # a new theme shows now, not after a restart
            self.models_page.library.refresh_facts()  # its estimate follows the whole-cache preference
            problem = self.settings.try_save()
            if problem:
                self._message(f"Your preferences apply now but could not be saved: {problem}. "
                              "Free some space; closing MTP Studio tries again.", 15000)
            if reload_needed:
                self.models.load()

    def closeEvent(self, event: QCloseEvent) -> None:
        save_window_state(self)
        if not self.server_may_stop():
            event.ignore()
            return
        if self.chat.busy:  # the partial reply is written now, as stopped (it can be continued next time)
            self.chat.stream.end_now()
        if not self.save_before_closing():
            event.ignore()
            return
        self.server_status.stop_server()
        self.message_actions.deletions.purge()  # quitting ends the undo window
        self.models_page.shutdown()
        event.accept()

    def server_may_stop(self) -> bool:
        """While the local server runs, ask before quitting; True when it is stopped or the user said quit."""
        question = self.server_status.quit_question()
        if not question:
            return True
        box = QMessageBox(QMessageBox.Icon.Question, "Quit MTP Studio?", question, parent=self)
        quit_button = box.addButton("Quit", QMessageBox.ButtonRole.DestructiveRole)
        box.setDefaultButton(box.addButton("Cancel", QMessageBox.ButtonRole.RejectRole))  # Enter keeps it running
        box.exec()
        return box.clickedButton() is quit_button

    def save_before_closing(self) -> bool:
        """Write what waits for the disk; True when all of it is written or the user chose to lose it."""
        while True:
            lost = []
            if not self.chat.saver.flush():
                exc = self.chat.saver.error
                why = "the disk is full" if isinstance(exc, DiskFull) else str(exc)
                lost.append(f"• a reply ({self.chat.saver.waiting_chars():,} characters): {why} "
                            f"({self.store.path.parent})")
            problem = self.settings.try_save()
            if problem:
                lost.append(f"• your preferences: {problem}")
            if not lost:
                return True
            box = QMessageBox(QMessageBox.Icon.Warning, "Not saved",
                              "This is not saved yet and is lost if MTP Studio quits now:\n\n" + "\n".join(lost)
                              + "\n\nFree some space on that disk, then choose Retry. Cancel keeps MTP Studio "
                                "open (a reply is saved by itself once there is room).", parent=self)
            retry = box.addButton("Retry", QMessageBox.ButtonRole.AcceptRole)
            give_up = box.addButton("Quit without saving", QMessageBox.ButtonRole.DestructiveRole)
            box.addButton("Cancel", QMessageBox.ButtonRole.RejectRole)
            box.setDefaultButton(retry)
            box.exec()
            if box.clickedButton() is give_up:
                self.chat.saver.discard()
                return True
            if box.clickedButton() is not retry:
                return False

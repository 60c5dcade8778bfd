"""The Local server panel (Tools → Local server…): start and stop the
OpenAI-compatible server, its address, port and API key, the base URL to
copy, and a live log of requests with their speed and draft acceptance.

The server runs in this process on its own thread and asyncio loop
(``engine.server.runner.ServerThread``) and reaches the engine through
:class:`~app.server_link.ChatEngineLink`: the chat's worker, shared request
by request (that module says how). Address, port and "require a key" persist
in the settings; the key itself lives in the OS keyring.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app import background
from app.server_link import ChatEngineLink
from app.settings import Settings
from app.text_check import is_text, not_text_notice
from engine.server import api_key
from engine.server.config import ConfigError, ServerConfig, is_loopback
from engine.server.metrics import Metrics, RequestRecord
from engine.server.runner import ServerThread

LOG_LINES = 500
AUTO_TEXT = "Auto (as many as fit, up to 4)"


class _RecordRelay(QObject):
    """Carries request records from the server's thread to the GUI thread (a queued signal)."""

    sig_record = Signal(object)


class ServerPanel(QDialog):
    """Signals:
        sig_running(bool): the server started (True) or stopped (False).
    """

    sig_running = Signal(bool)

    def __init__(self, settings: Settings, link: ChatEngineLink, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Local server")
        self.settings, self.link = settings, link
        self.server: ServerThread | None = None
        self._key = ""
        self._relay = _RecordRelay(self)
        self._relay.sig_record.connect(self._show_record)
        self._build()
        self._update()
        self.start_button.setEnabled(False)  # until the stored key is read (the keyring may be slow)
        self._key_task = background.run(api_key.get_key)
        self._key_task.sig_done.connect(self._key_loaded)
        app = QGuiApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.stop)

    # -- layout -------------------------------------------------------------
    def _build(self) -> None:
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.host = QComboBox()
        self.host.setEditable(True)
        self.host.addItems(["127.0.0.1", "0.0.0.0"])
        self.host.setCurrentText(self.settings.server_host)
        self.host.setToolTip("127.0.0.1: this computer only. Any other address lets other machines connect, "
                             "and needs the API key.")
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(self.settings.server_port)
        self.parallel = QSpinBox()
        self.parallel.setRange(0, 16)
        self.parallel.setSpecialValueText(AUTO_TEXT)  # shown for 0
        self.parallel.setValue(self.settings.parallel)
        self.parallel.setToolTip("Requests decoded together, the chat's and the server's: the model is loaded with "
                                 "this many sequences of the context size each. Auto: as many as fit in memory "
                                 "beside the model, up to 4. 1: one at a time, the others wait. Applies when the "
                                 "model is next loaded (Model → Reload).")
        self.pool_each = QCheckBox("A memory pool per reply")
        self.pool_each.setChecked(not self.settings.kv_unified)
        self.pool_each.setToolTip("Off: the replies decoded at once keep their context in one pool, so requests "
                                  "sharing a long system prompt read it once; but each reply then attends over "
                                  "every reply's context. On: a pool each, as llama-server's --parallel N, faster "
                                  "with many long conversations at once; a shared prompt is copied. Applies when "
                                  "the model is next loaded (Model → Reload).")
        self.require_key = QCheckBox("Require the API key (always, when not on 127.0.0.1)")
        self.require_key.setChecked(self.settings.server_require_key)
        self.key = QLineEdit(self._key)
        self.key.setReadOnly(True)
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.show_key = QPushButton("Show")
        self.show_key.setCheckable(True)
        self.copy_key = QPushButton("Copy")
        self.regenerate = QPushButton("Regenerate")
        key_row = QHBoxLayout()
        for w in (self.key, self.show_key, self.copy_key, self.regenerate):
            key_row.addWidget(w)
        self.key_note = QLabel()
        self.key_note.setWordWrap(True)
        self.base_url = QLineEdit()
        self.base_url.setReadOnly(True)
        self.copy_url = QPushButton("Copy")
        url_row = QHBoxLayout()
        url_row.addWidget(self.base_url)
        url_row.addWidget(self.copy_url)
        self.start_button = QPushButton("Start server")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.log.setPlaceholderText("Requests appear here: status, tokens, speed, draft acceptance.")
        form = QFormLayout()
        form.addRow("Address", self.host)
        form.addRow("Port", self.port)
        form.addRow("Replies at once", self.parallel)
        form.addRow("", self.pool_each)
        form.addRow("", self.require_key)
        form.addRow("API key", key_row)
        form.addRow("", self.key_note)
        form.addRow("Base URL", url_row)
        col = QVBoxLayout(self)
        col.addWidget(self.status)
        col.addLayout(form)
        col.addWidget(self.start_button)
        col.addWidget(QLabel("Requests"))
        col.addWidget(self.log, 1)
        self.resize(720, 520)
        self.start_button.clicked.connect(self.toggle)
        self.show_key.toggled.connect(self._show_key)
        self.copy_key.clicked.connect(lambda: self._copy(self._key, "API key"))
        self.copy_url.clicked.connect(lambda: self._copy(self.base_url.text(), "Base URL"))
        self.regenerate.clicked.connect(self.new_key)
        self.host.currentTextChanged.connect(lambda _t: self._update())
        self.port.valueChanged.connect(lambda _v: self._update())
        self.require_key.toggled.connect(lambda _on: self._update())
        self.parallel.valueChanged.connect(self._parallel_changed)
        self.pool_each.toggled.connect(self._pool_changed)

    def loaded_sequences(self) -> int:
        """Replies the loaded model decodes at once (what Auto chose), else the setting, at least 1."""
        model = self.link.model()
        return model.n_seq if model is not None else max(1, self.settings.parallel)

    def _parallel_changed(self, value: int) -> None:
        """Remember it; the worker gets it with the next load (the load options carry it)."""
        self.settings.parallel = value
        self.settings.try_save()

    def _pool_changed(self, each: bool) -> None:
        """Remember it; the worker gets it with the next load, as the replies at once."""
        self.settings.kv_unified = not each
        self.settings.try_save()

    # -- actions ----------------------------------------------------------------
    def toggle(self) -> None:
        if self.server is None:
            self.start()
        else:
            self.stop()

    def start(self) -> bool:
        host, port = self.host.currentText().strip(), self.port.value()
        if not (is_text(host) and host.isprintable()):  # the socket call would raise TypeError inside Qt
            self.status.setText(f"Not started: {not_text_notice('Address')}")
            return False
        needs_key = self.require_key.isChecked() or not is_loopback(host)
        if needs_key and not self._key:
            self.new_key()
        config = ServerConfig(host=host, port=port, api_key=self._key if needs_key else None,
                              parallel=self.loaded_sequences())
        metrics = Metrics(on_record=self._relay.sig_record.emit)  # emitted on the server's thread: queued
        try:
            self.server = ServerThread(self.link, config, metrics).start()
        except (ConfigError, OSError, RuntimeError) as exc:
            self.server = None
            self.status.setText(f"Not started: {getattr(exc, 'strerror', None) or exc}")
            return False
        self.settings.server_host, self.settings.server_port = host, port
        self.settings.server_require_key = self.require_key.isChecked()
        self.settings.try_save()  # on a full disk: kept in memory, saved at quit
        self._update()
        self.sig_running.emit(True)
        return True

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
            self.sig_running.emit(False)
        self._update()

    def new_key(self) -> None:
        """A fresh key, stored in the keyring; a running server keeps the key it started with until restarted."""
        self._key = api_key.generate()
        self.key.setText(self._key)
        self._store_task = background.run(api_key.set_key, self._key)  # the keyring may wait on a desktop service
        self._store_task.sig_done.connect(self._key_stored)
        self._update()

    def _key_stored(self, stored: object) -> None:
        self.key_note.setText("" if stored else "No system keyring is available: this key lasts until MTP Studio "
                              "quits.")

    @property
    def running(self) -> bool:
        return self.server is not None

    # -- display ------------------------------------------------------------------
    def _update(self) -> None:
        running = self.server is not None
        for w in (self.host, self.port, self.require_key):
            w.setEnabled(not running)
        self.start_button.setText("Stop server" if running else "Start server")
        if running:
            assert self.server is not None
            self.base_url.setText(self.server.base_url)
            model = self.link.model()
            name = Path(model.path).name if model else "no model yet"
            key = "API key required" if self.server.config.api_key else "no API key (this computer only)"
            self.status.setText(f"Serving {name} at {self.server.base_url} — {key}. "
                                "Chat replies and server requests take turns on one engine.")
        else:
            host = self.host.currentText().strip() or "127.0.0.1"
            self.base_url.setText(ServerConfig(host=host, port=self.port.value()).base_url)
            self.status.setText("Stopped. Editors, agents and scripts can use the loaded model through an "
                                "OpenAI-compatible API once started.")

    def _key_loaded(self, key: object) -> None:
        self._key = key if isinstance(key, str) else ""
        self.key.setText(self._key)
        self.start_button.setEnabled(True)

    def _show_key(self, on: bool) -> None:
        self.key.setEchoMode(QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password)
        self.show_key.setText("Hide" if on else "Show")

    def _copy(self, text: str, what: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.status.setText(f"{what} copied.")

    def _show_record(self, record: RequestRecord) -> None:
        self.log.appendPlainText(record.line())

    def on_engine_died(self) -> None:
        """The link's ``on_death``: while serving, restart the engine (the app reloads the model)."""
        if self.running and self.parent() is not None:
            restart = getattr(getattr(self.parent(), "engine_status", None), "restart", None)
            if restart is not None:  # not inside the dying process's own signal: on the next turn of the loop
                QTimer.singleShot(0, restart)
                self.status.setText("The engine stopped; restarting it and loading the model again…")


def open_panel(window: Any) -> ServerPanel:
    """Show the window's Local server panel, making it (and its engine link) the first time."""
    panel: ServerPanel | None = getattr(window, "server_panel", None)
    if panel is None:
        link = ChatEngineLink(window.client, lambda: window.chat.profile_speculative, model=window.models.model,
                              parent=window)
        panel = ServerPanel(window.settings, link, window)
        link.on_death = panel.on_engine_died
        window.server_panel = panel
    panel.show()
    panel.raise_()
    panel.activateWindow()
    return panel

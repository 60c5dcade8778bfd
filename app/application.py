"""The composition root: builds the services, wires them, runs the event loop."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication

from app.chat.store import ConversationStore
from app.engine_client import EngineClient
from app.json_process import JsonProcess
from app.main_window import MainWindow
from app.settings import Settings
from engine import paths


class Services:
    """Everything the window needs, built once; tests build the same thing."""

    def __init__(self) -> None:
        self.settings = Settings.load()
        self.store = ConversationStore(paths.data_dir() / "conversations.sqlite3")
        self.client = EngineClient()
        self.window = MainWindow(self.settings, self.store, self.client)
        self._probe: JsonProcess | None = None

    def start(self) -> None:
        self.window.show()
        self.client.start()
        self._probe_hardware()

    def _probe_hardware(self) -> None:
        """The fingerprint keys autotune profiles; probing runs in a child process."""
        self._probe = JsonProcess()

        def on_report(data: dict) -> None:
            self.window.hardware_fingerprint = data.get("fingerprint")
            if self.window.model_facts:
                self.window.apply_profile(self.window.model_facts)

        self._probe.sig_message.connect(on_report)
        self._probe.start(["hardware", "--json"])

    def shutdown(self) -> None:
        if self._probe is not None:
            self._probe.stop()
        self.client.stop()
        self.settings.save()
        self.store.close()


def run(argv: list[str]) -> int:
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    app.setApplicationName("MTP Studio")
    app.setOrganizationName("MTP Studio")
    services = Services()
    services.start()
    try:
        return int(app.exec())
    finally:
        services.shutdown()

"""The composition root: builds the services, wires them, runs the event loop."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QApplication

from app.chat.store import ConversationStore
from app.engine_client import EngineClient
from app.hardware_probe import HardwareProbe
from app.main_window import MainWindow
from app.settings import Settings
from engine import paths


class Services:
    """Everything the window needs, built once; tests build the same thing."""

    def __init__(self) -> None:
        self.settings = Settings.load()
        self.store = ConversationStore(paths.data_dir() / "conversations.sqlite3")
        self.client = EngineClient()
        # One probe for the app: its fingerprint keys autotune profiles, and
        # the Hardware page and the autotune wizard show its report.
        self.probe = HardwareProbe()
        self.window = MainWindow(self.settings, self.store, self.client, self.probe)

    def start(self) -> None:
        self.window.show()
        self.client.start()
        self.probe.ensure()

    def shutdown(self) -> None:
        self.probe.stop()
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

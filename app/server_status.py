"""The local server's state in the status bar: stopped, or the address it serves on and the requests in
flight. Once its panel is closed nothing else shows that the server runs; a click opens the panel. Quitting
while it runs asks first (:meth:`ServerStatus.quit_question`): editors and agents using it would lose it
without a word."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtWidgets import QToolButton, QWidget

STOPPED = "Server: stopped"


class ServerStatus(QToolButton):
    """A flat button: ``Server: 127.0.0.1:8181 · 2 requests``, or ``Server: stopped``."""

    def __init__(self, open_panel: Callable[[], object], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAutoRaise(True)
        self._panel: Any = None
        self._in_flight = 0
        self.clicked.connect(lambda: open_panel())
        self._show()

    def follow(self, panel: Any) -> None:
        """Show ``panel``'s server (a ServerPanel: its ``sig_running`` and its link's ``sig_in_flight``)."""
        if panel is self._panel:
            return
        self._panel = panel
        panel.sig_running.connect(lambda _on: self._show())
        panel.link.sig_in_flight.connect(self._set_in_flight)
        self._show()

    @property
    def address(self) -> str:
        """``host:port`` while serving, else ""."""
        server = getattr(self._panel, "server", None)
        return f"{server.config.host}:{server.config.port}" if server is not None else ""

    def quit_question(self) -> str:
        """What to ask before quitting while the server runs ("" when it is stopped)."""
        if not self.address:
            return ""
        n = self._panel.link.in_flight()  # now, not as the last queued signal said: a request may just have come
        return (f"The local server is running at {self.address} with {n} request{'s' if n != 1 else ''} in flight; "
                "quit anyway? Editors and agents using it lose their connection.")

    def stop_server(self) -> None:
        """Stop the server (quitting: its requests end now rather than with the engine)."""
        if self._panel is not None and self._panel.running:
            self._panel.stop()

    def _set_in_flight(self, count: int) -> None:
        self._in_flight = count
        self._show()

    def _show(self) -> None:
        address = self.address
        if not address:
            self.setText(STOPPED)
            self.setToolTip("The local server (OpenAI-compatible API) is not running. Click to open its panel.")
            return
        requests = f" · {self._in_flight} request{'s' if self._in_flight != 1 else ''}" if self._in_flight else ""
        self.setText(f"Server: {address}{requests}")
        self.setToolTip(f"The local server answers at {self._panel.server.base_url}. Click to open its panel; "
                        "Stop server there ends it.")

"""Quitting: with the local server running the app asks first (and Cancel keeps both running); quitting
while a reply streams keeps every token received so far, as a stopped reply that Continue can go on
from. Against the real worker and a real server."""

from __future__ import annotations

import threading

import httpx
from PySide6.QtWidgets import QMessageBox

from tests.app.conftest import start_and_load
from tests.app.test_server_status import free_port
from tests.engine.conftest import synth


def answer_with(monkeypatch, button: str, shown: list[str]) -> None:
    """Every message box records its text and is answered by clicking ``button``."""
    def ask(box: QMessageBox) -> int:
        shown.append(box.text())
        next(b for b in box.buttons() if b.text() == button).click()
        return 0

    monkeypatch.setattr(QMessageBox, "exec", ask)


def start_server(qtbot, window) -> int:
    window.open_server_panel()
    panel = window.server_panel
    qtbot.waitUntil(panel.start_button.isEnabled, timeout=10000)
    port = free_port()
    panel.port.setValue(port)
    panel.start_button.click()
    assert panel.running
    panel.close()
    return port


def test_quitting_with_the_server_running_asks_and_cancel_keeps_it(qtbot, services, monkeypatch):
    services.settings.model_path = str(synth("glm4moe").path("combined"))
    start_and_load(qtbot, services)
    window = services.window
    window.show()
    port = start_server(qtbot, window)
    shown: list[str] = []
    answer_with(monkeypatch, "Cancel", shown)
    window.close()
    assert shown == [f"The local server is running at 127.0.0.1:{port} with 0 requests in flight; quit anyway? "
                     "Editors and agents using it lose their connection."]
    assert window.isVisible() and window.server_panel.running
    # a request in flight is counted in the question
    body = {"model": "m", "messages": [{"role": "user", "content": "hello world the"}], "max_tokens": 200}
    answers: list[object] = []

    def ask() -> None:  # quitting may cut this request off: the answer or the error is kept
        try:
            answers.append(httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120))
        except httpx.HTTPError as exc:
            answers.append(exc)

    thread = threading.Thread(target=ask)
    thread.start()
    qtbot.waitUntil(lambda: window.server_panel.link.in_flight() == 1, timeout=30000)
    answer_with(monkeypatch, "Quit", shown)
    window.close()
    assert "with 1 request in flight" in shown[-1]
    assert not window.isVisible() and not window.server_panel.running  # quitting stopped the server
    thread.join(timeout=60)
    assert answers  # the client was answered or cut off, not left waiting


def test_closing_with_the_server_stopped_asks_nothing(qtbot, services, monkeypatch):
    start_and_load(qtbot, services)
    window = services.window
    window.show()
    shown: list[str] = []
    answer_with(monkeypatch, "Quit", shown)
    window.close()
    assert shown == [] and not window.isVisible()


def test_quitting_while_a_reply_streams_keeps_every_token_received(qtbot, services):
    services.settings.max_tokens = 4000
    start_and_load(qtbot, services)
    window = services.window
    window.show()
    chat = window.chat
    window.composer.setPlainText("the river model")
    window.send()
    qtbot.waitUntil(lambda: len(chat.stream._text) > 40, timeout=60000)
    reply_id = chat.stream.reply.id
    window.close()
    received = chat.stream._text
    assert not window.isVisible() and not chat.busy
    stored = next(m for m in services.store.messages(chat.conversation_id) if m.id == reply_id)
    assert stored.status == "cancelled" and stored.content == received  # nothing lost since the last save
    assert window.transcript.messages[-1].unfinished  # Continue is offered for it next time

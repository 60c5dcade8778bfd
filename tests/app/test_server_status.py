"""The local server's state in the status bar, against the real worker and a real HTTP request: stopped,
then the address it serves on and the requests in flight, after its panel is closed too; a click opens the
panel."""

from __future__ import annotations

import socket
import threading

import httpx

from app.server_status import STOPPED
from tests.app.conftest import start_and_load
from tests.engine.conftest import synth


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_status_bar_shows_the_server_its_address_and_requests_in_flight(qtbot, services):
    services.settings.model_path = str(synth("glm4moe").path("combined"))
    start_and_load(qtbot, services)
    window = services.window
    status = window.server_status
    assert status.text() == STOPPED and status.isVisibleTo(window)
    status.click()  # opens the panel
    panel = window.server_panel
    assert panel.isVisible()
    qtbot.waitUntil(panel.start_button.isEnabled, timeout=10000)  # the stored key was read
    port = free_port()
    panel.port.setValue(port)
    panel.start_button.click()
    assert panel.running and status.text() == f"Server: 127.0.0.1:{port}"
    panel.close()  # nothing else shows that the server runs now
    seen: list[tuple[int, str]] = []
    panel.link.sig_in_flight.connect(lambda n: seen.append((n, status.text())))
    body = {"model": "m", "messages": [{"role": "user", "content": "hello world the"}], "max_tokens": 16}
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(
        httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120)))
    thread.start()
    qtbot.waitUntil(lambda: bool(answers), timeout=60000)
    thread.join()
    assert answers[0].status_code == 200, answers[0].text
    assert (1, f"Server: 127.0.0.1:{port} · 1 request") in seen and seen[-1] == (0, f"Server: 127.0.0.1:{port}")
    status.click()
    assert panel.isVisible()
    panel.start_button.click()  # Stop server
    assert not panel.running and status.text() == STOPPED

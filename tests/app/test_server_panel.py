"""The Local server panel: started from the Tools menu, it serves the chat's
model over HTTP while the chat keeps working on the same engine."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading

import httpx
import pytest
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLineEdit

from tests.app.conftest import start_and_load, type_and_send
from tests.engine.conftest import synth


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post_in_thread(url: str, body: dict[str, object], out: list[httpx.Response]) -> threading.Thread:
    """The request runs off the GUI thread: the GUI thread must keep running the engine client."""
    thread = threading.Thread(target=lambda: out.append(httpx.post(url, json=body, timeout=120)))
    thread.start()
    return thread


def open_and_start(qtbot, services) -> object:
    """Load the tiny synthetic MTP model in the app, open Tools → Local server, start it on a free port."""
    services.settings.model_path = str(synth("glm4moe").path("combined"))
    start_and_load(qtbot, services)
    window = services.window
    action = next(a for m in window.menuBar().actions() if m.text() == "&Tools" for a in m.menu().actions()
                  if a.text().startswith("Local server"))
    action.trigger()
    panel = window.server_panel
    qtbot.waitUntil(panel.start_button.isEnabled, timeout=10000)  # the stored key was read
    panel.port.setValue(free_port())
    panel.start_button.click()
    assert panel.running, panel.status.text()
    return panel


def test_panel_starts_serves_beside_the_chat_and_stops(qtbot, services):
    panel = open_and_start(qtbot, services)
    window, port = services.window, panel.port.value()
    assert panel.base_url.text() == f"http://127.0.0.1:{port}/v1"
    panel.copy_url.click()
    assert QGuiApplication.clipboard().text() == panel.base_url.text()
    first_key = panel.key.text()
    panel.regenerate.click()
    assert panel.key.text() != first_key and panel.key.text().startswith("mtp-")
    assert panel.key.echoMode() == QLineEdit.EchoMode.Password
    panel.show_key.click()
    assert panel.key.echoMode() == QLineEdit.EchoMode.Normal
    panel.copy_key.click()
    assert QGuiApplication.clipboard().text() == panel.key.text()

    models = httpx.get(f"{panel.base_url.text()}/models", timeout=10).json()["data"]
    body = {"model": models[0]["id"], "messages": [{"role": "user", "content": "hello world the"}],
            "max_tokens": 24, "temperature": 0}
    alone: list[httpx.Response] = []
    post_in_thread(f"{panel.base_url.text()}/chat/completions", body, alone)
    qtbot.waitUntil(lambda: bool(alone), timeout=60000)
    assert alone[0].status_code == 200, alone[0].text
    qtbot.waitUntil(lambda: "200" in panel.log.toPlainText(), timeout=5000)
    assert "tok/s" in panel.log.toPlainText() and "/chat" in panel.log.toPlainText()

    # the chat and the server at once, on one engine: each gets its own reply, whole
    services.settings.max_tokens = 24
    beside: list[httpx.Response] = []
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000) as finished:
        post_in_thread(f"{panel.base_url.text()}/chat/completions", body, beside)
        type_and_send(qtbot, window, "river valley")
    qtbot.waitUntil(lambda: bool(beside), timeout=60000)
    assert finished.args == ["complete"]
    assert beside[0].json()["choices"][0]["message"]["content"] == alone[0].json()["choices"][0]["message"]["content"]
    chat_reply = services.store.messages(window.chat.conversation_id)[-1]
    assert chat_reply.stats["generated_tokens"] == 24 and chat_reply.content

    panel.start_button.click()
    assert not panel.running and services.settings.server_port == port
    try:
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        raise AssertionError("the server still answers after Stop")
    except httpx.ConnectError:
        pass


def test_a_worker_crash_fails_the_server_request_and_the_app_restarts_the_engine(qtbot, services):
    panel = open_and_start(qtbot, services)
    url = f"{panel.base_url.text()}/completions"
    body = {"model": "combined", "prompt": "hello world the", "max_tokens": 6000, "temperature": 0}
    dead = services.client.pid
    os.kill(dead, signal.SIGSTOP)  # the request cannot finish before the crash
    failed: list[httpx.Response] = []
    post_in_thread(url, body, failed)
    qtbot.waitUntil(lambda: panel.server.metrics.processing == 1, timeout=10000)
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000):  # restarted, the model loaded again
        os.kill(dead, signal.SIGKILL)
        qtbot.waitUntil(lambda: bool(failed), timeout=10000)
    assert failed[0].status_code == 503 and failed[0].json()["error"]["code"] == "worker_died"
    assert services.client.pid != dead and panel.running
    served: list[httpx.Response] = []
    post_in_thread(url, {**body, "max_tokens": 5}, served)
    qtbot.waitUntil(lambda: bool(served), timeout=60000)
    assert served[0].status_code == 200 and served[0].json()["usage"]["completion_tokens"] == 5
    panel.stop()


def test_a_request_the_engine_cannot_take_is_a_400_and_the_next_is_served_at_once(qtbot, services):
    """A lone surrogate ("\\ud800") once raised inside Qt and held every later request for the request
    timeout. The edge refuses it; behind the edge the link refuses it on the server's thread, and a
    send that fails on the GUI thread still ends its request."""
    from engine.errors import ProtocolError
    from engine.worker import protocol as P

    panel = open_and_start(qtbot, services)
    url = panel.base_url.text()
    model = httpx.get(f"{url}/models", timeout=10).json()["data"][0]["id"]
    bad = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi \ud800"}], "max_tokens": 4})
    refused: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: refused.append(httpx.post(
        f"{url}/chat/completions", content=bad.encode("ascii"), headers={"Content-Type": "application/json"},
        timeout=30)))
    thread.start()
    qtbot.waitUntil(lambda: bool(refused), timeout=40000)
    assert refused[0].status_code == 400 and refused[0].json()["error"]["code"] == "invalid_text", refused[0].text
    good = {"model": model, "messages": [{"role": "user", "content": "hello world the"}], "max_tokens": 4,
            "temperature": 0}
    served: list[httpx.Response] = []
    post_in_thread(f"{url}/chat/completions", good, served)
    qtbot.waitUntil(lambda: bool(served), timeout=30000)
    assert served[0].status_code == 200 and served[0].json()["usage"]["completion_tokens"] == 4

    link, events = panel.link, []
    with pytest.raises(ProtocolError, match="not valid Unicode"):
        link.submit(P.GenerateRequestMsg(id="h-bad", prompt="a\ud800"), events.append)
    assert "h-bad" not in link._sinks and not events
    link._sinks["h-gui"] = events.append  # as submit leaves it; then the GUI thread's write fails
    link._send(P.GenerateRequestMsg(id="h-gui", prompt="a\ud800"))
    qtbot.waitUntil(lambda: len(events) == 2, timeout=5000)  # the client answers it from the event loop
    assert [e.type for e in events] == ["error", "done"] and "h-gui" not in link._sinks
    panel.stop()


def test_a_stopped_engine_is_reported_unhealthy_and_healthy_again_when_it_runs(qtbot, services):
    panel = open_and_start(qtbot, services)
    health = panel.base_url.text().removesuffix("/v1") + "/health"

    def status() -> int:  # asked off the GUI thread: the GUI thread carries the engine's answer
        out: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: out.append(httpx.get(health, timeout=10)))
        thread.start()
        qtbot.waitUntil(lambda: bool(out), timeout=15000)
        return out[0].status_code

    assert status() == 200
    os.kill(services.client.pid, signal.SIGSTOP)
    try:
        assert status() == 503
    finally:
        os.kill(services.client.pid, signal.SIGCONT)
    qtbot.waitUntil(lambda: status() == 200, timeout=15000)
    panel.stop()


def test_with_two_replies_at_once_a_server_request_does_not_wait_for_the_chats_reply(qtbot, services):
    services.settings.parallel = 2  # the model is loaded with two sequences
    panel = open_and_start(qtbot, services)
    assert panel.parallel.value() == 2 and panel.server.config.parallel == 2
    window, url = services.window, f"{panel.base_url.text()}/completions"
    body = {"model": "combined", "prompt": "hello world the", "max_tokens": 16, "temperature": 0}
    alone: list[httpx.Response] = []
    post_in_thread(url, body, alone)
    qtbot.waitUntil(lambda: bool(alone), timeout=60000)
    services.settings.max_tokens = 2000
    beside: list[httpx.Response] = []
    type_and_send(qtbot, window, "river valley")
    qtbot.waitUntil(lambda: window.chat.busy, timeout=10000)
    post_in_thread(url, body, beside)
    qtbot.waitUntil(lambda: bool(beside), timeout=60000)
    assert window.chat.busy  # served while the chat's reply still streams, not after it
    assert beside[0].json()["choices"][0]["text"] == alone[0].json()["choices"][0]["text"]
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.chat.stop()
    panel.stop()


def test_replies_at_once_default_to_auto_and_the_server_admits_what_the_load_chose(qtbot, services):
    assert services.settings.parallel == 0  # a fresh install: Auto
    panel = open_and_start(qtbot, services)
    from app.server_panel import AUTO_TEXT

    assert panel.parallel.text() == AUTO_TEXT
    model = services.window.models.model
    assert model is not None and model.n_seq >= 1
    assert panel.server.config.parallel == model.n_seq  # the sequences Auto loaded, not 0
    panel.stop()


def test_a_memory_pool_per_reply_is_a_preference_that_persists_and_reaches_the_load(qtbot, services):
    """Tools → Local server, "A memory pool per reply": off by default (one pool: a shared system prompt is
    read once); checked, it is saved and the next load keeps a pool per sequence, as `serve --no-kv-unified`;
    the replies served are the same."""
    from app.settings import Settings

    services.settings.parallel = 2
    panel = open_and_start(qtbot, services)
    assert not panel.pool_each.isChecked() and services.window.models.model.kv_unified
    url = f"{panel.base_url.text()}/completions"
    body = {"model": "combined", "prompt": "hello world the", "max_tokens": 16, "temperature": 0}

    def text() -> str:
        out: list[httpx.Response] = []
        post_in_thread(url, body, out)
        qtbot.waitUntil(lambda: bool(out), timeout=60000)
        return out[0].json()["choices"][0]["text"]

    one_pool = text()
    panel.stop()
    panel.pool_each.setChecked(True)
    assert not Settings.load().kv_unified  # saved as it was checked
    window = services.window
    next(a for m in window.menuBar().actions() if m.text() == "&Model" for a in m.menu().actions()
         if a.text() == "Reload").trigger()  # the tooltip's Model → Reload
    qtbot.waitUntil(lambda: window.models.model is not None and not window.models.model.kv_unified, timeout=60000)
    assert window.models.model.n_seq == 2
    panel.start_button.click()
    assert panel.running, panel.status.text()
    assert text() == one_pool
    panel.stop()

"""The main window against the real worker and the real default model."""

from __future__ import annotations

import os
import signal

from engine.speculative.settings import SPECULATION_OFF
from tests.app.conftest import start_and_load, type_and_send


def test_typed_prompt_streams_a_reply_that_is_stored(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 24
    seen: list[str] = []
    services.client.sig_token.connect(lambda ev: seen.append(ev.text))
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000) as finished:
        type_and_send(qtbot, window, "The capital of France is")
    assert finished.args == ["complete"]
    assert len(seen) >= 2  # it streamed, token by token
    reply = "".join(seen)
    assert reply.strip() and reply.strip() in window.transcript.toPlainText()
    assert "24 tokens" in window.transcript.toPlainText()  # the reply's footer
    msgs = services.store.messages(window.chat.conversation_id)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == reply and msgs[1].status == "complete"
    assert msgs[1].stats["generated_tokens"] == 24
    assert window.composer.toPlainText() == ""


def test_stop_ends_the_reply_and_keeps_what_streamed(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 2000
    with qtbot.waitSignal(services.client.sig_token, timeout=60000):
        type_and_send(qtbot, window, "Once upon a time")
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=30000) as finished:
        window.stop_button.click()
    assert finished.args == ["cancelled"]
    reply = services.store.messages(window.chat.conversation_id)[-1]
    assert reply.status == "cancelled" and reply.content


def test_killed_worker_shows_banner_keeps_conversation_and_recovers(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 2000
    with qtbot.waitSignal(services.client.sig_token, timeout=60000):
        type_and_send(qtbot, window, "Once upon a time")
    qtbot.wait(300)
    with qtbot.waitSignal(services.client.sig_died, timeout=10000) as died:
        os.kill(services.client.pid, signal.SIGKILL)
    assert "SIGKILL" in died.args[0]
    assert window.banner.isVisible() or not window.isVisible()
    assert "SIGKILL" in window.banner.label.text()
    conv = window.chat.conversation_id
    msgs = services.store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].status == "interrupted" and msgs[1].content  # the partial reply is kept
    assert "Once upon a time" in window.transcript.toPlainText()
    assert "interrupted" in window.transcript.toPlainText()

    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000):
        window.banner.button.click()
    services.settings.max_tokens = 8
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000) as finished:
        type_and_send(qtbot, window, "The capital of France is")
    assert finished.args == ["complete"]
    assert len(services.store.messages(conv)) == 4


def test_conversations_survive_an_app_restart(qtbot, services, tmp_path):
    start_and_load(qtbot, services)
    services.settings.max_tokens = 6
    with qtbot.waitSignal(services.window.chat.sig_reply_finished, timeout=60000):
        type_and_send(qtbot, services.window, "Hello there")
    conv = services.window.chat.conversation_id
    services.settings.n_threads = 1
    services.shutdown()

    from app.application import Services

    again = Services()
    qtbot.addWidget(again.window)
    try:
        assert again.window.chat.conversation_id == conv
        assert "Hello there" in again.window.transcript.toPlainText()
        assert again.window.conversations.model().rowCount() == 1
    finally:
        again.client.stop()
        again.store.close()


def test_a_chats_own_settings_override_the_preferences(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 50
    conv = window.chat.new_conversation()
    services.store.update(conv, settings={"max_tokens": 5, "speculative": "off"}, system_prompt="Be brief.")
    assert window.chat.chat_values().max_tokens == 5
    assert window.chat.speculative_settings() == SPECULATION_OFF
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        type_and_send(qtbot, window, "The capital of France is")
    reply = services.store.messages(conv)[-1]
    assert reply.stats["generated_tokens"] == 5

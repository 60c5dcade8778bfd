"""A chat's system prompt is shown above its messages, with an Edit link to the chat's settings; a prompt
changed there shows at once, and a chat without one shows none (the real window and worker)."""

from __future__ import annotations

from PySide6.QtCore import QUrl

from app.chat.chat_settings import ChatSettingsDialog
from tests.app.conftest import send_and_wait, start_and_load


def test_the_system_prompt_is_shown_and_its_edit_link_opens_the_chats_settings(qtbot, services, monkeypatch):
    services.settings.system_prompt = "You are a terse pirate."
    start_and_load(qtbot, services)
    window = services.window
    window.conversation_list.new_chat()
    text = window.transcript.toPlainText()
    assert text.startswith("System prompt: You are a terse pirate.") and "Edit" in text
    opened: list[str] = []

    def user(dialog: ChatSettingsDialog) -> int:
        opened.append(dialog.system_prompt.toPlainText())
        dialog.system_prompt.setPlainText("Answer in one line.")
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(ChatSettingsDialog, "exec", user)
    window.transcript._on_anchor(QUrl("system-prompt:"))  # the Edit link
    assert opened == ["You are a terse pirate."]
    assert window.transcript.toPlainText().startswith("System prompt: Answer in one line.")
    assert services.store.get(window.chat.conversation_id).system_prompt == "Answer in one line."
    # a reply keeps it on top; a chat with none shows none
    services.settings.max_tokens = 4
    send_and_wait(qtbot, window, "hello")
    window.chat.open(window.chat.conversation_id)
    assert window.transcript.toPlainText().startswith("System prompt: Answer in one line.")
    services.settings.system_prompt = ""
    window.conversation_list.new_chat()
    assert "System prompt" not in window.transcript.toPlainText()

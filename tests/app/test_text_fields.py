"""Text the user types that is not valid Unicode (issue 31, "Unicode in the app's other text").

A lone surrogate ("\\ud800": a broken paste, a bad escape) cannot be stored as
UTF-8, sent to the worker or written to a log. The chat's send path refuses it
(tests/app/test_reliability.py); so does every other field whose text reaches
the store, the settings or the worker: the user is told which field, what they
typed stays where it was, nothing is changed and nothing raises.

PySide6 drops a lone surrogate on its way into a Qt text widget, so these
tests hand the text over where the app reads the widget (its ``text()`` /
``toPlainText()``), as a paste that kept it would.
"""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QInputDialog

BAD = "\ud800"


def seeded_chat(services) -> tuple[int, int]:
    """A chat with one exchange, shown: (conversation id, the user message's id)."""
    store = services.store
    conv = store.create("Rivers")
    asked = store.add_message(conv.id, "user", "Tell me about the river.")
    store.add_message(conv.id, "assistant", "It runs to the sea.")
    services.window.chat.open(conv.id)
    services.window.conversation_list.refresh()
    return conv.id, asked.id


def exchange(services, conv_id: int) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in services.store.messages(conv_id)]


def test_an_edit_with_a_lone_surrogate_keeps_the_exchange_and_what_was_typed(services):
    window, chat = services.window, services.window.chat
    conv_id, message_id = seeded_chat(services)
    before = exchange(services, conv_id)
    window.chat_pane.edit_last()
    assert window.chat_pane.edit_bar.message_id == message_id

    assert not chat.send_edited(message_id, f"Tell me about {BAD} the sea.")
    assert exchange(services, conv_id) == before  # the old exchange is not deleted for an edit that cannot be sent
    assert [m.content for m in chat.transcript.messages] == [c for _r, c in before]
    assert "not valid text" in window.statusBar().currentMessage()
    assert window.chat_pane.edit_bar.editing  # still editing: the user fixes the text and sends again
    assert not chat.busy


def test_chat_settings_with_a_lone_surrogate_in_the_system_prompt_stay_in_the_dialog(services, monkeypatch):
    from app.chat.chat_settings import ChatSettingsDialog

    window = services.window
    conv_id, _ = seeded_chat(services)
    seen: list[tuple[int, str]] = []

    def user(dialog: ChatSettingsDialog) -> int:
        dialog.system_prompt.toPlainText = lambda: f"Answer {BAD} briefly."  # what a paste that kept it gives
        dialog.accept()
        seen.append((dialog.result(), dialog.problem.text()))
        del dialog.system_prompt.toPlainText
        dialog.system_prompt.setPlainText("Answer briefly.")
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(ChatSettingsDialog, "exec", user)
    window.open_chat_settings()
    result, problem = seen[0]
    assert result == 0  # refused: the dialog stays open with what was typed
    assert "System prompt" in problem and "not valid text" in problem
    assert services.store.get(conv_id).system_prompt == "Answer briefly."


def test_a_rename_with_a_lone_surrogate_is_asked_again_with_the_reason(services, monkeypatch):
    convs = services.window.conversation_list
    conv_id, _ = seeded_chat(services)
    asked: list[tuple[str, str]] = []

    def get_text(_parent, _title, label, *_args, text="", **_kw):
        asked.append((label, text))
        return (f"Rivers {BAD} of Europe", True) if len(asked) == 1 else ("Rivers of Europe", True)

    monkeypatch.setattr(QInputDialog, "getText", get_text)
    convs.rename(conv_id)
    assert len(asked) == 2
    assert "not valid text" in asked[1][0]
    assert asked[1][1] == f"Rivers {BAD} of Europe"  # what was typed is offered again to fix
    assert services.store.get(conv_id).title == "Rivers of Europe"


@pytest.mark.parametrize(("field", "getter", "label"), [
    ("system_prompt", "toPlainText", "System prompt for new chats"),
    ("rpc_servers", "text", "Remote devices"),
])
def test_preferences_with_a_lone_surrogate_stay_in_the_dialog(qtbot, field, getter, label):
    from app.settings import Settings
    from app.settings_dialog import SettingsDialog

    settings = Settings()
    dialog = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(dialog)
    setattr(getattr(dialog, field), getter, lambda: f"a {BAD} b")
    dialog.accept()
    assert dialog.result() == 0
    assert label in dialog.problem.text() and "not valid text" in dialog.problem.text()
    assert getattr(settings, field) == getattr(Settings(), field)  # nothing applied


def test_a_server_address_with_a_lone_surrogate_is_refused_with_a_reason(services):
    from app.server_panel import open_panel

    panel = open_panel(services.window)
    panel.host.currentText = lambda: f"127.0.0.{BAD}"
    assert panel.start() is False
    assert not panel.running
    assert "Address" in panel.status.text() and "not valid text" in panel.status.text()
    assert services.settings.server_host == "127.0.0.1"

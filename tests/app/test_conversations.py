"""The conversation list: a proper Qt item model over the store, and the
controller that keeps it in step with the open chat."""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt

from app.chat.controller import ChatController
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore
from app.chat.transcript import TranscriptView
from app.conversations import ConversationController, ConversationListModel, ConversationSidebar, ModelRole
from app.engine_client import EngineClient
from app.settings import Settings
from app.theme import LIGHT


def test_the_list_model_passes_qts_model_checks_and_filters_by_search(qtmodeltester, tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        rivers = store.create("Rivers")
        store.add_message(rivers.id, "user", "the Rhine")
        store.create("Mountains")
        model = ConversationListModel(store)
        model.reload()
        qtmodeltester.check(model)
        assert model.rowCount() == 2
        assert model.index(0).data(Qt.ItemDataRole.DisplayRole) == "Mountains"  # newest first
        assert model.index(1).data(ModelRole.ID) == rivers.id
        model.reload("rhine")  # message text matches too
        assert model.rowCount() == 1 and model.row_of(rivers.id) == 0
        assert model.rowCount(model.index(0)) == 0  # a list: no children
        assert model.data(QModelIndex()) is None
    finally:
        store.close()


def _chat_list(qtbot, store: ConversationStore) -> tuple:
    """A chat controller and the conversation list beside it, on real widgets (no worker)."""
    transcript = TranscriptView(LIGHT)
    qtbot.addWidget(transcript)
    chat = ChatController(store, EngineClient(), transcript, StatsPanel(LIGHT), Settings())
    model = ConversationListModel(store)
    sidebar = ConversationSidebar(model)
    qtbot.addWidget(sidebar)
    return transcript, chat, model, sidebar, ConversationController(store, chat, sidebar, model)


def test_deleting_the_open_conversation_closes_it_and_updates_the_list(qtbot, tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        transcript, chat, model, sidebar, conversations = _chat_list(qtbot, store)
        conversations.new_chat()
        conversations.new_chat()  # the open chat is still empty: reused, not a second "New chat"
        assert model.rowCount() == 1
        store.add_message(chat.conversation_id, "user", "hello")
        conversations.new_chat()
        assert model.rowCount() == 2
        open_id = chat.conversation_id
        assert sidebar.list.currentIndex().data(ModelRole.ID) == open_id  # the open chat is selected
        conversations.delete(open_id)
        assert chat.conversation_id is None and model.rowCount() == 1
        assert model.row_of(open_id) is None
    finally:
        store.close()


def test_a_right_click_on_another_chat_leaves_the_open_one_selected(qtbot, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QMenu

    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        transcript, chat, model, sidebar, conversations = _chat_list(qtbot, store)
        sidebar.show()
        other = store.create("Other chat")
        store.add_message(other.id, "user", "the other one")
        conversations.new_chat()
        store.add_message(chat.conversation_id, "user", "the open one")
        chat.open(chat.conversation_id)
        conversations.refresh()
        open_id = chat.conversation_id
        shown: list[list[str]] = []

        class Menu(QMenu):  # the menu as shown, closed at once
            def exec(self, *_a):
                shown.append([a.text() for a in self.actions()])

        monkeypatch.setattr("app.conversations.QMenu", Menu)
        rect = sidebar.list.visualRect(model.index(model.row_of(other.id)))
        qtbot.mouseClick(sidebar.list.viewport(), Qt.MouseButton.RightButton, pos=rect.center())
        sidebar.list.customContextMenuRequested.emit(rect.center())  # offscreen Qt sends no context-menu event
        assert shown and "Rename…" in shown[-1]
        assert chat.conversation_id == open_id and transcript.messages[0].content == "the open one"
        assert sidebar.list.currentIndex().data(ModelRole.ID) == open_id
    finally:
        store.close()

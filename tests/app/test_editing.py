"""Non-destructive editing (edit with Cancel, reply versions, delete that asks)
and the window's polish (Esc, shortcuts, export, theme, remembered sizes).

Most tests drive the real chat controller, transcript and panes against a
stand-in engine client that answers at once; Esc is tested against the real
worker, since stopping a real reply is the point.
"""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QObject, QStandardPaths, Qt, QTimer, QUrl, Signal
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox, QPushButton

from app.chat.chat_pane import ChatPane
from app.chat.controller import ChatController
from app.chat.stats_panel import StatsPanel
from app.chat.store import ConversationStore
from app.chat.transcript import TranscriptView
from app.conversations import ConversationController, ConversationListModel, ConversationSidebar
from app.settings import Settings
from app.theme import DARK, LIGHT
from engine.speculative.stats import StatsSnapshot
from engine.worker.events import DoneEvent, TokenEvent
from tests.app.conftest import start_and_load, write_database


class FakeClient(QObject):
    """Answers every request with "Answer N" on the next turn of the event loop."""

    sig_token = Signal(object)
    sig_stats = Signal(object)
    sig_prefill = Signal(object)
    sig_done = Signal(object)
    sig_error = Signal(object)
    sig_died = Signal(str)
    sig_loaded = Signal(object)
    sig_tokens = Signal(object)
    max_draft = 3
    state = "ready"

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[dict[str, str]]] = []

    def generate(self, **kw) -> str:
        self.asked.append(kw.get("messages") or [])
        rid, n = f"r{len(self.asked)}", len(self.asked)
        QTimer.singleShot(0, lambda: self._answer(rid, n))
        return rid

    def _answer(self, rid: str, n: int) -> None:
        self.sig_token.emit(TokenEvent(rid, f"Answer {n}"))
        self.sig_done.emit(DoneEvent(rid, "stop", StatsSnapshot(generated_tokens=n, elapsed=1.0)))

    def cancel(self, rid: str | None = None) -> None:
        pass


@pytest.fixture()
def chat(qtbot, tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    transcript = TranscriptView(LIGHT)
    qtbot.addWidget(transcript)
    controller = ChatController(store, FakeClient(), transcript, StatsPanel(LIGHT), Settings())
    pane = ChatPane(controller, transcript, lambda: "", LIGHT, above=[])
    qtbot.addWidget(pane)
    yield controller, pane, store
    store.close()


def say(qtbot, controller, pane, text: str) -> None:
    pane.composer.setPlainText(text)
    with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
        pane.send()


def test_edit_then_cancel_keeps_the_exchange_and_the_draft(qtbot, chat):
    controller, pane, store = chat
    say(qtbot, controller, pane, "First question")
    pane.composer.setPlainText("a draft I was typing")
    pane.edit_button.click()
    assert pane.composer.toPlainText() == "First question" and pane.edit_bar.isVisibleTo(pane)
    assert [m.content for m in store.messages(controller.conversation_id)] == ["First question", "Answer 1"]
    pane.edit_bar.cancel_button.click()
    assert not pane.edit_bar.isVisibleTo(pane)
    assert pane.composer.toPlainText() == "a draft I was typing"
    assert [m.content for m in store.messages(controller.conversation_id)] == ["First question", "Answer 1"]
    assert "Answer 1" in controller.transcript.toPlainText()


def test_edit_then_send_branches_and_the_arrows_switch_the_whole_branch_back(qtbot, chat, tmp_path):
    controller, pane, store = chat
    say(qtbot, controller, pane, "One")
    say(qtbot, controller, pane, "Two")
    with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
        pane.regen_button.click()  # "Two" has a reply with two versions
    pane.edit_button.click()
    pane.composer.setPlainText("Two, better")
    with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
        pane.send()
    conv = controller.conversation_id
    assert [m.content for m in store.messages(conv)] == ["One", "Answer 1", "Two, better", "Answer 4"]
    edited = store.messages(conv)[2]
    assert (edited.version, edited.version_count) == (1, 2)
    assert "2/2" in controller.transcript.toPlainText()
    with qtbot.waitSignal(controller.transcript.sig_version):
        controller.transcript._on_anchor(QUrl("version:2:-1"))  # back to the first branch, its reply versions too
    assert [m.content for m in store.messages(conv)] == ["One", "Answer 1", "Two", "Answer 3"]
    reply = store.messages(conv)[3]
    assert (reply.version, reply.version_count) == (1, 2)
    shown = controller.transcript.toPlainText()
    assert "Two, better" not in shown and "Answer 3" in shown and "1/2" in shown
    store.close()
    again = ConversationStore(tmp_path / "c.sqlite3")  # both branches are on disk
    try:
        again.select_version(again.messages(conv)[2].id, 1)
        assert [m.content for m in again.messages(conv)] == ["One", "Answer 1", "Two, better", "Answer 4"]
        branches = again.export_json(conv)["messages"][2]["versions"]
        assert [b["content"] for b in branches] == ["Two", "Two, better"]
        assert [m["content"] for m in branches[0]["tail"]] == ["Answer 3"]
    finally:
        again.close()
        controller.store = ConversationStore(tmp_path / "c.sqlite3")


def test_any_message_can_be_edited_from_its_edit_link_and_the_later_turns_stay_in_the_old_branch(qtbot, chat):
    controller, pane, store = chat
    for text in ("One", "Two", "Three"):
        say(qtbot, controller, pane, text)
    with qtbot.waitSignal(controller.transcript.sig_edit):
        controller.transcript._on_anchor(QUrl("edit:0"))
    assert pane.composer.toPlainText() == "One" and pane.edit_bar.isVisibleTo(pane)
    pane.composer.setPlainText("One, again")
    with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
        pane.send()
    conv = controller.conversation_id
    assert [m.content for m in store.messages(conv)] == ["One, again", "Answer 4"]
    assert controller.client.asked[-1] == [{"role": "user", "content": "One, again"}]
    assert store.get(conv).title == "One, again"
    controller.transcript._on_anchor(QUrl("version:0:-1"))
    assert [m.content for m in store.messages(conv)] == ["One", "Answer 1", "Two", "Answer 2", "Three", "Answer 3"]


def test_a_database_with_reply_versions_opens_and_branches_keep_every_message(tmp_path):
    path = tmp_path / "old.sqlite3"
    write_database(path, OLD_SCHEMA)
    store = ConversationStore(path)  # migrated from before versions
    try:
        user, reply = store.messages(1)
        store.new_version(reply.id)
        store.update_message(reply.id, content="hello, second", status="complete")
        _edited, new_reply = store.branch(user.id, "hi there")
        assert [m.content for m in store.messages(1)] == ["hi there", ""]
        store.select_version(user.id, 0)
        kept = store.messages(1)
        assert [m.content for m in kept] == ["hi", "hello, second"] and kept[1].version_count == 2
        assert store.select_version(kept[1].id, 0).content == "hello"
        assert store.get(1).title == "Old chat"
    finally:
        store.close()


def test_continue_link_after_stop_streams_on_into_the_same_reply(qtbot, chat):
    controller, pane, store = chat
    say(qtbot, controller, pane, "Question")
    conv = controller.conversation_id
    reply = store.messages(conv)[1]
    store.update_message(reply.id, status="cancelled")
    controller.open(conv)
    assert "Continue" in controller.transcript.toPlainText()
    with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
        controller.transcript._on_anchor(QUrl("continue:"))
    msgs = store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[1].content == "Answer 1Answer 2" and msgs[1].status == "complete"
    assert controller.client.asked[-1][-1] == {"role": "assistant", "content": "Answer 1"}
    assert "Continue" not in controller.transcript.toPlainText()


def test_edit_then_send_replaces_only_the_last_exchange(qtbot, chat):
    controller, pane, store = chat
    say(qtbot, controller, pane, "One")
    say(qtbot, controller, pane, "Two")
    pane.edit_button.click()
    pane.composer.setPlainText("Two, better")
    with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
        pane.send()
    assert [m.content for m in store.messages(controller.conversation_id)] == ["One", "Answer 1", "Two, better",
                                                                               "Answer 3"]
    assert not pane.edit_bar.isVisibleTo(pane)
    assert "Two, better" in controller.transcript.toPlainText()
    assert "Answer 2" not in controller.transcript.toPlainText()


def test_regenerate_keeps_versions_that_the_arrows_switch_and_the_store_keeps(qtbot, chat, tmp_path):
    controller, pane, store = chat
    say(qtbot, controller, pane, "Question")
    for _ in range(2):
        with qtbot.waitSignal(controller.sig_reply_finished, timeout=5000):
            pane.regen_button.click()
    conv = controller.conversation_id
    msgs = store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"]  # one reply, three versions
    assert msgs[1].content == "Answer 3" and (msgs[1].version, msgs[1].version_count) == (2, 3)
    assert controller.client.asked[2] == controller.client.asked[0]  # asked without the old reply
    shown = controller.transcript.toPlainText()
    assert "3/3" in shown and "Answer 3" in shown and "Answer 1" not in shown
    with qtbot.waitSignal(controller.transcript.sig_version):
        controller.transcript._on_anchor(QUrl("version:1:-1"))
    assert "2/3" in controller.transcript.toPlainText() and "Answer 2" in controller.transcript.toPlainText()
    controller.transcript._on_anchor(QUrl("version:1:-1"))
    controller.transcript._on_anchor(QUrl("version:1:-1"))  # no version before the first
    assert "1/3" in controller.transcript.toPlainText()
    reply = store.messages(conv)[1]
    assert reply.content == "Answer 1" and reply.stats["generated_tokens"] == 1
    store.close()
    again = ConversationStore(tmp_path / "c.sqlite3")  # kept on disk
    try:
        reply = again.messages(conv)[1]
        assert (reply.content, reply.version, reply.version_count) == ("Answer 1", 0, 3)
        exported = again.export_json(conv)["messages"][1]
        assert [v["content"] for v in exported["versions"]] == ["Answer 1", "Answer 2", "Answer 3"]
    finally:
        again.close()
        controller.store = ConversationStore(tmp_path / "c.sqlite3")


OLD_SCHEMA = """
CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL, system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}', created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE, role TEXT NOT NULL,
    content TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'complete', stats TEXT, created REAL NOT NULL);
INSERT INTO conversations VALUES (1, 'Old chat', '', '{}', 1.0, 2.0);
INSERT INTO messages VALUES (1, 1, 'user', 'hi', 'complete', NULL, 1.0);
INSERT INTO messages VALUES (2, 1, 'assistant', 'hello', 'complete', '{"generated_tokens": 1}', 1.5);
"""


def test_a_database_from_before_versions_opens_and_gains_them(tmp_path):
    path = tmp_path / "old.sqlite3"
    write_database(path, OLD_SCHEMA)
    store = ConversationStore(path)
    try:
        assert store.get(1).title == "Old chat" and store.get(1).model == ""
        reply = store.messages(1)[1]
        assert (reply.content, reply.version, reply.version_count) == ("hello", 0, 1)
        store.new_version(reply.id)
        store.update_message(reply.id, content="hello again", status="complete")
        assert store.select_version(reply.id, 0).content == "hello"
        assert store.select_version(reply.id, 1).version_count == 2
    finally:
        store.close()
    again = ConversationStore(path)  # opening twice migrates once
    try:
        assert again.messages(1)[1].content == "hello again"
    finally:
        again.close()


@pytest.fixture()
def conversations(qtbot, chat):
    controller, _pane, store = chat
    model = ConversationListModel(store)
    sidebar = ConversationSidebar(model)
    qtbot.addWidget(sidebar)
    return ConversationController(store, controller, sidebar, model), model, store


def test_deleting_a_conversation_asks_first(qtbot, conversations, monkeypatch):
    convs, model, store = conversations
    convs.new_chat()
    asked: list[str] = []

    def answer(choice):
        def question(_parent, _title, text, *_args, **_kw):
            asked.append(text)
            return choice
        return question

    conv_id = convs.chat.conversation_id
    monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.StandardButton.No))
    convs.ask_delete(conv_id)
    assert model.rowCount() == 1 and "New chat" in asked[0]
    monkeypatch.setattr(QMessageBox, "question", answer(QMessageBox.StandardButton.Yes))
    convs.ask_delete(conv_id)
    assert model.rowCount() == 0 and convs.chat.conversation_id is None


def test_chats_with_the_same_title_show_date_and_model(qtbot, conversations):
    convs, model, store = conversations
    a, b = store.create("Copper"), store.create("Copper")
    store.create("Tin")
    store.update(a.id, model="gemma-3-270m")
    model.reload()
    labels = {model.index(r).data(): model.index(r).data(Qt.ItemDataRole.UserRole + 1) for r in range(3)}
    by_id = {v: k for k, v in labels.items()}
    assert by_id[a.id].startswith("Copper") and "gemma-3-270m" in by_id[a.id] and by_id[a.id] != by_id[b.id]
    assert any(ch.isdigit() for ch in by_id[b.id].removeprefix("Copper"))  # a date
    assert "Tin" in labels  # a unique title stays as it is


def test_export_starts_in_documents_with_markdown_json_and_text_filters(qtbot, conversations, monkeypatch, tmp_path):
    convs, _model, store = conversations
    convs.new_chat()
    store.add_message(convs.chat.conversation_id, "user", "hello there")
    seen: dict[str, str] = {}

    def save_as(_parent, _caption, start, filters, selected=""):
        seen.update(start=start, filters=filters, selected=selected)
        return str(tmp_path / "out"), "Text (*.txt)"

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_as)
    convs.export("md")
    docs = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    assert seen["start"].startswith(docs)
    assert seen["filters"].split(";;") == ["Markdown (*.md)", "JSON (*.json)", "Text (*.txt)"]
    assert seen["selected"] == "Markdown (*.md)"
    written = (tmp_path / "out.txt").read_text()  # the chosen filter decides the format and extension
    assert "You:" in written and "hello there" in written
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "c.json"), "JSON (*.json)"))
    convs.export("md")
    assert json.loads((tmp_path / "c.json").read_text())["messages"][0]["content"] == "hello there"


def test_disabled_buttons_look_disabled_in_both_themes(qtbot):
    from app.theme import apply_qt_palette

    for palette in (LIGHT, DARK):
        apply_qt_palette(palette)
        on, off = QPushButton("Send"), QPushButton("Send")
        off.setEnabled(False)
        for b in (on, off):
            qtbot.addWidget(b)
            b.resize(80, 30)
        assert on.grab().toImage() != off.grab().toImage()
        assert off.palette().color(off.palette().ColorGroup.Disabled, off.palette().ColorRole.ButtonText) != \
            on.palette().color(on.palette().ColorGroup.Active, on.palette().ColorRole.ButtonText)
    apply_qt_palette(LIGHT)


def test_esc_stops_a_reply_and_the_window_remembers_its_sizes(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 2000
    window.composer.setPlainText("Once upon a time")
    with qtbot.waitSignal(services.client.sig_token, timeout=60000):
        window.send()
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=30000) as finished:
        qtbot.keyClick(window.composer, Qt.Key.Key_Escape)
    assert finished.args == ["cancelled"]
    shortcuts = {a.text(): a.shortcut().toString() for a in window.findChildren(type(window.menuBar().actions()[0]))}
    assert shortcuts.get("Preferences…") and shortcuts.get("Regenerate") and shortcuts.get("Search conversations")
    # the offscreen screen is 800 x 600: restoring keeps a window on it. The window's own minimum (what
    # its pages need, a loaded model's header included) must leave room on that screen.
    width = max(760, window.minimumSizeHint().width())
    assert width < 800, f"the window needs {width} px: it no longer fits an 800 px screen"
    window.resize(width, 560)
    window.splitter.setSizes([170, 400, 170])
    saved = window.splitter.sizes()
    window.close()
    assert services.settings.window_state.get("geometry") and services.settings.window_state.get("splitter")
    from app.window_extras import restore_window_state

    window.resize(500, 400)
    window.splitter.setSizes([100, 300, 100])
    restore_window_state(window)
    qtbot.wait(20)
    # the saved width, or what the window needs now if a late layout (a loaded model's header) grew it
    assert window.size().width() == max(width, window.minimumSizeHint().width())
    assert window.splitter.sizes() == saved


def test_the_theme_switches_live(qtbot, services):
    window = services.window
    services.settings.theme = "light"
    from app.window_extras import apply_theme

    apply_theme(window)
    light_bg = window.palette().color(window.palette().ColorRole.Window).lightness()
    services.settings.theme = "dark"
    apply_theme(window)
    assert window.palette().color(window.palette().ColorRole.Window).lightness() < light_bg
    assert window.transcript.palette_ is DARK and window.palette_ is DARK
    sheet = QApplication.instance().styleSheet()  # input boxes keep a visible border in dark
    assert "QPlainTextEdit" in sheet and DARK.border in sheet
    services.settings.theme = "light"
    apply_theme(window)  # the next tests see the light theme again


def test_an_empty_reply_is_replaced_not_kept_as_a_version(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    try:
        conv = store.create()
        store.add_message(conv.id, "user", "hi")
        reply = store.add_message(conv.id, "assistant", "", status="error")
        again = store.new_version(reply.id)
        assert (again.version, again.version_count, again.status) == (0, 1, "streaming")
        store.update_message(reply.id, content="hello", status="complete")
        assert store.new_version(reply.id).version_count == 2
    finally:
        store.close()

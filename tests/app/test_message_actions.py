"""Each message's Copy, Delete (undoable) and Fork links, clicked with the mouse in the real transcript,
against the real worker: Copy puts the message's text on the clipboard; Delete removes it from the chat
and the conversation's rows but keeps the row until the undo window passes (Undo and Ctrl+Z bring it back
in its place; quitting drops it; a crash before then brings it back at the next start); Fork opens a new
conversation holding the messages up to the one forked from, the original unchanged."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import QApplication

from app.chat import message_actions
from app.chat.store import ConversationStore
from tests.app.conftest import send_and_wait, start_and_load


def send(qtbot, window, text: str) -> None:
    send_and_wait(qtbot, window, text)


def click_link(qtbot, view, href: str) -> None:
    """Click the link ``href`` where the transcript shows it."""
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref() == href:
                cursor = QTextCursor(view.document())
                cursor.setPosition(fragment.position() + fragment.length() // 2)
                view.setTextCursor(cursor)
                view.ensureCursorVisible()
                where = view.cursorRect(cursor).center()
                qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=where)
                return
            it += 1
        block = block.next()
    raise AssertionError(f"no link {href} in the transcript")


def two_turns(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    window.show()
    services.settings.max_tokens = 6
    send(qtbot, window, "The river")
    send(qtbot, window, "The mountain")
    conv = window.chat.conversation_id
    assert [m.role for m in services.store.messages(conv)] == ["user", "assistant", "user", "assistant"]
    return window, conv


def test_copy_puts_the_messages_text_on_the_clipboard(qtbot, services):
    window, conv = two_turns(qtbot, services)
    QGuiApplication.clipboard().clear()
    click_link(qtbot, window.transcript, "message-copy:1")
    assert QGuiApplication.clipboard().text() == services.store.messages(conv)[1].content != ""
    assert window.statusBar().currentMessage() == "Message copied"


def test_delete_is_undone_by_the_bar_and_by_ctrl_z_and_kept_until_then(qtbot, services):
    window, conv = two_turns(qtbot, services)
    store = services.store
    before = [(m.id, m.content) for m in store.messages(conv)]
    click_link(qtbot, window.transcript, "message-delete:1")
    assert [m.id for m in store.messages(conv)] == [before[0][0], before[2][0], before[3][0]]
    assert [m.id for m in window.transcript.messages] == [before[0][0], before[2][0], before[3][0]]
    assert window.undo_bar.isVisibleTo(window) and window.undo_bar.label.text() == "Message deleted."
    kept = store.db.execute("SELECT id FROM deleted_messages").fetchall()
    assert [r[0] for r in kept] == [before[1][0]]  # the row is kept in the store meanwhile
    window.undo_bar.undo_button.click()
    assert [(m.id, m.content) for m in store.messages(conv)] == before  # back in its place
    assert not window.undo_bar.isVisibleTo(window)
    # Ctrl+Z where the click left the focus (the transcript), and the undo window running out
    click_link(qtbot, window.transcript, "message-delete:3")
    assert window.transcript.hasFocus()
    qtbot.keyClick(window.transcript, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert [(m.id, m.content) for m in store.messages(conv)] == before
    click_link(qtbot, window.transcript, "message-delete:2")
    window.message_actions.deletions._timer.setInterval(50)
    window.message_actions.deletions._timer.start()
    qtbot.waitUntil(lambda: not window.undo_bar.isVisibleTo(window), timeout=5000)
    assert store.db.execute("SELECT COUNT(*) FROM deleted_messages").fetchone()[0] == 0
    assert [m.id for m in store.messages(conv)] == [before[0][0], before[1][0], before[3][0]]
    assert not window.undo_delete.isEnabled()


def test_quitting_drops_a_deleted_message_and_a_crash_brings_it_back(qtbot, services):
    window, conv = two_turns(qtbot, services)
    store = services.store
    ids = [m.id for m in store.messages(conv)]
    # a crash: the row moved aside, nothing dropped it; the next start (another window on the same file) puts
    # it back
    message_actions.Deletions(store).delete(ids[3])
    again = ConversationStore(store.path)
    try:
        assert message_actions.Deletions(again).restore_leftovers() == 1
        assert [m.id for m in again.messages(conv)] == ids
    finally:
        again.close()
    click_link(qtbot, window.transcript, "message-delete:3")
    window.close()
    assert not window.isVisible()
    assert [m.id for m in store.messages(conv)] == ids[:3]
    assert store.db.execute("SELECT COUNT(*) FROM deleted_messages").fetchone()[0] == 0


def test_fork_opens_a_new_conversation_up_to_that_message(qtbot, services):
    window, conv = two_turns(qtbot, services)
    store = services.store
    store.update(conv, system_prompt="Be brief.")
    original = [(m.role, m.content) for m in store.messages(conv)]
    click_link(qtbot, window.transcript, "message-fork:2")
    fork_id = window.chat.conversation_id
    assert fork_id != conv
    assert [(m.role, m.content) for m in store.messages(fork_id)] == original[:3]
    assert [(m.role, m.content) for m in store.messages(conv)] == original
    fork = store.get(fork_id)
    assert fork.title == f"{store.get(conv).title} (fork)" and fork.system_prompt == "Be brief."
    assert window.conversations.currentIndex().data() is not None
    assert store.list()[0].id == fork_id  # listed first, and shown
    assert [m.content for m in window.transcript.messages] == [c for _r, c in original[:3]]
    # the fork answers on its own
    send(qtbot, window, "The sea")
    assert len(store.messages(fork_id)) == 5 and len(store.messages(conv)) == 4
    QApplication.processEvents()

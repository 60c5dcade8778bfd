"""Keyboard-only use of the main window, with real key presses: Tab leaves the
message box, Ctrl+Tab types a tab in it, Ctrl+1/2/3 and Ctrl+Tab switch pages,
Ctrl+N shows the new chat from any page and reuses one never written in."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from tests.app.conftest import start_and_load

CTRL, SHIFT = Qt.KeyboardModifier.ControlModifier, Qt.KeyboardModifier.ShiftModifier


def active(qtbot, window):
    """Shown and active: window shortcuts only fire in the active window."""
    window.show()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window)
    return window


def test_tab_and_shift_tab_move_the_focus_out_of_the_message_box_and_back(qtbot, services):
    window = active(qtbot, services.window)
    window.composer.setFocus()
    qtbot.keyClicks(window.composer, "two words")
    qtbot.keyClick(window.composer, Qt.Key.Key_Tab)
    after = QApplication.focusWidget()
    assert after is not window.composer and after is not None
    assert window.composer.toPlainText() == "two words"  # no tab typed
    qtbot.keyClick(after, Qt.Key.Key_Backtab, SHIFT)
    assert QApplication.focusWidget() is window.composer
    qtbot.keyClick(window.composer, Qt.Key.Key_Tab, CTRL)
    assert window.composer.toPlainText() == "two words\t"  # Ctrl+Tab types one
    assert window.tabs.currentIndex() == 0 and QApplication.focusWidget() is window.composer


def test_ctrl_digits_and_ctrl_tab_switch_pages_from_anywhere(qtbot, services):
    window = active(qtbot, services.window)
    window.composer.setFocus()
    for key, page in ((Qt.Key.Key_2, window.models_page), (Qt.Key.Key_3, window.hardware_page),
                      (Qt.Key.Key_1, window.splitter)):
        qtbot.keyClick(QApplication.focusWidget() or window, key, CTRL)
        assert window.tabs.currentWidget() is page
    window.tabs.setCurrentIndex(2)
    window.hardware_page.log.setFocus()  # a text box on the Hardware page: Ctrl+Tab used to stop there
    qtbot.keyClick(window.hardware_page.log, Qt.Key.Key_Tab, CTRL)
    assert window.tabs.currentIndex() == 0  # wrapped round to Chat
    assert QApplication.focusWidget() is window.composer  # where the focus was on this page
    qtbot.keyClick(window.composer, Qt.Key.Key_PageDown, CTRL)  # here Ctrl+Tab types a tab; Ctrl+PgDown steps on
    assert window.tabs.currentIndex() == 1
    qtbot.keyClick(QApplication.focusWidget() or window, Qt.Key.Key_Tab, CTRL)
    assert window.tabs.currentIndex() == 2
    qtbot.keyClick(QApplication.focusWidget() or window, Qt.Key.Key_Backtab, CTRL | SHIFT)
    assert window.tabs.currentIndex() == 1
    qtbot.keyClick(QApplication.focusWidget() or window, Qt.Key.Key_PageUp, CTRL)
    assert window.tabs.currentIndex() == 0
    assert window.composer.toPlainText() == ""


def test_ctrl_n_shows_the_new_chat_and_reuses_one_never_written_in(qtbot, services):
    start_and_load(qtbot, services)
    window = active(qtbot, services.window)
    store = services.store
    window.tabs.setCurrentIndex(1)  # the Models page
    qtbot.keyClick(window.models_page, Qt.Key.Key_N, CTRL)
    assert window.tabs.currentIndex() == 0, "Ctrl+N made a chat the user could not see"
    assert QApplication.focusWidget() is window.composer
    first = window.chat.conversation_id
    assert first is not None and len(store.list()) == 1
    qtbot.keyClick(window.composer, Qt.Key.Key_N, CTRL)  # again, nothing written: the same chat
    assert window.chat.conversation_id == first and len(store.list()) == 1
    assert window.conversations.model().rowCount() == 1
    services.settings.max_tokens = 8
    window.composer.setPlainText("Hello")
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    window.tabs.setCurrentIndex(2)
    qtbot.keyClick(window.hardware_page, Qt.Key.Key_N, CTRL)  # a chat with messages: a new one
    assert window.tabs.currentIndex() == 0
    assert window.chat.conversation_id != first and len(store.list()) == 2
    assert window.transcript.messages == []

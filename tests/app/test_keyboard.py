"""Keyboard-only use of the main window, with real key presses: Tab leaves the
message box, Ctrl+Tab types a tab in it, Ctrl+1/2/3 and Ctrl+Tab switch pages,
Ctrl+N shows the new chat from any page and reuses one never written in."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication

from tests.app.conftest import start_and_load, type_and_send

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


def test_shift_enter_starts_a_new_line_and_enter_sends(qtbot, services):
    window = active(qtbot, services.window)
    submitted: list = []
    window.composer.sig_submit.connect(lambda: submitted.append(True))
    window.composer.setFocus()
    qtbot.keyClicks(window.composer, "first")
    qtbot.keyClick(window.composer, Qt.Key.Key_Return, SHIFT)
    qtbot.keyClicks(window.composer, "second")
    assert window.composer.toPlainText() == "first\nsecond" and not submitted
    qtbot.keyClick(window.composer, Qt.Key.Key_Return)
    assert submitted == [True]


def test_help_lists_every_menu_shortcut_and_the_message_box_keys(qtbot, services):
    from app.shortcuts_sheet import MESSAGE_BOX_KEYS

    window = active(qtbot, services.window)
    qtbot.keyClick(window.composer, Qt.Key.Key_F1)
    sheet = window.shortcuts_sheet
    qtbot.waitUntil(sheet.isVisible)
    rows = sheet.rows()
    by_command = {command: keys for _where, command, keys in rows}
    for command, key in (("Chat", "Ctrl+1"), ("Models", "Ctrl+2"), ("Hardware", "Ctrl+3"), ("New chat", "Ctrl+N"),
                         ("Next page", "Ctrl+Tab"), ("Stop reply", "Esc"), ("Regenerate", "Ctrl+R"),
                         ("Keyboard shortcuts", "F1")):
        assert key in by_command[command].split(" or "), (command, by_command.get(command))
    shortcuts = [a for a in window.findChildren(QAction) if any(not k.isEmpty() for k in a.shortcuts())]
    listed = {command for _where, command, _keys in rows}
    assert {a.text().rstrip("…") for a in shortcuts} <= listed  # nothing with a key is left out
    assert all(row in rows for row in MESSAGE_BOX_KEYS)


def test_tab_from_the_message_box_goes_to_send_then_the_other_reply_buttons(qtbot, services):
    window = active(qtbot, services.window)
    start_and_load(qtbot, services)
    services.settings.max_tokens = 4
    pane = window.chat_pane
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        type_and_send(qtbot, window, "Name a colour.")
    assert pane.send_button.isEnabled() and pane.regen_button.isEnabled()  # a chat with a reply: both enabled
    window.composer.setFocus()
    qtbot.keyClicks(window.composer, "hello")
    qtbot.keyClick(window.composer, Qt.Key.Key_Tab)
    assert QApplication.focusWidget() is pane.send_button  # not Regenerate, laid out first in the row
    qtbot.keyClick(pane.send_button, Qt.Key.Key_Backtab, SHIFT)
    assert QApplication.focusWidget() is window.composer
    buttons = [pane.send_button, pane.stop_button, pane.continue_button, pane.regen_button, pane.edit_button]
    chain, widget = [], window.composer
    while len(chain) < 12:  # the chain's next focusable widgets after the box (disabled and hidden ones too)
        widget = widget.nextInFocusChain()
        if widget.focusPolicy() & Qt.FocusPolicy.TabFocus:
            chain.append(widget)
    assert chain[:5] == buttons  # then Stop, Continue, Regenerate and Edit, the rest of the window after them

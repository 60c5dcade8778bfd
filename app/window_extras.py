"""The main window's keyboard shortcuts, remembered size and live theme.

Kept apart from ``main_window.py``, which only builds and wires: these act on
the finished window and read what they need from it (its chat, chat pane,
sidebar, splitter and settings).

- Shortcuts: Esc stops a reply (or cancels an edit), Ctrl+R regenerates,
  Ctrl+E edits the last message, Ctrl+F searches the conversations, and
  Preferences gets Ctrl+, where the platform has no standard key for it
  (Linux, Windows). View → Chat / Models / Hardware are Ctrl+1/2/3, and
  Ctrl+Tab / Ctrl+Shift+Tab step through the pages from any widget (the tab
  bar's own Ctrl+Tab only works where no child takes the key first; the
  message box keeps Ctrl+Tab for a tab character). Help → Keyboard shortcuts
  (F1, Ctrl+/) lists them all.
- The window's geometry and the splitter between sidebar, chat and
  statistics are saved in the settings when the window closes and restored
  when it opens (Qt's own ``saveGeometry``/``saveState``, base64 in JSON).
- The theme switches without a restart: the Qt palette and style sheet are
  replaced and every widget that draws with our :class:`Palette` gets the new
  one; "system" follows the OS when its colour scheme changes.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QMainWindow, QWidget

from app.theme import Palette, apply_qt_palette, palette_for

PREFERENCES_FALLBACK = "Ctrl+,"


def install_window_extras(window: Any) -> None:
    """Add the shortcuts, restore the saved size and follow the OS theme (for "system")."""
    _add_view_menu(window)
    _add_chat_menu(window)
    _add_help_menu(window)
    prefs = next((a for a in window.findChildren(QAction) if a.text() == "Preferences…"), None)
    if prefs is not None:
        prefs.setShortcuts([*QKeySequence.keyBindings(QKeySequence.StandardKey.Preferences),
                            QKeySequence(PREFERENCES_FALLBACK)])
    restore_window_state(window)
    hints = QGuiApplication.styleHints()
    if hasattr(hints, "colorSchemeChanged"):
        hints.colorSchemeChanged.connect(lambda _scheme: window.settings.theme == "system" and apply_theme(window))


def _add_help_menu(window: Any) -> None:
    """Help → Keyboard shortcuts (app/shortcuts_sheet.py), About MTP Studio (app/about.py): versions of the
    app, Qt and the engine build."""
    from app.about import AboutDialog

    menu = window.menuBar().addMenu("&Help")
    _shortcut(window, menu, "Keyboard shortcuts", lambda: show_shortcuts(window),
              [*QKeySequence.keyBindings(QKeySequence.StandardKey.HelpContents), QKeySequence("Ctrl+/")])
    action = QAction("About MTP Studio", window)
    action.setMenuRole(QAction.MenuRole.AboutRole)  # macOS moves it into the application menu
    action.triggered.connect(lambda: AboutDialog(window).exec())
    menu.addAction(action)


def show_shortcuts(window: Any) -> Any:
    """Open the shortcuts sheet (not blocking: it can stay beside the window while the keys are tried)."""
    from app.shortcuts_sheet import ShortcutsSheet

    sheet = ShortcutsSheet(window)
    sheet.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    window.shortcuts_sheet = sheet
    sheet.show()
    return sheet


def _add_view_menu(window: Any) -> None:
    """View: one entry per page (Ctrl+1, Ctrl+2, …), then the next and previous page."""
    menu = window.menuBar().addMenu("&View")
    before = next((a for a in window.menuBar().actions() if a.text() == "&Model"), None)
    if before is not None:  # after File, where applications put View
        window.menuBar().insertMenu(before, menu)
    tabs = window.tabs
    for index in range(tabs.count()):
        _shortcut(window, menu, tabs.tabText(index), lambda *_checked, i=index: tabs.setCurrentIndex(i),
                  [QKeySequence(f"Ctrl+{index + 1}")])
    menu.addSeparator()
    _shortcut(window, menu, "Next page", lambda: tabs.setCurrentIndex((tabs.currentIndex() + 1) % tabs.count()),
              [QKeySequence("Ctrl+Tab"), QKeySequence("Ctrl+PgDown")])
    _shortcut(window, menu, "Previous page",
              lambda: tabs.setCurrentIndex((tabs.currentIndex() - 1) % tabs.count()),
              [QKeySequence("Ctrl+Shift+Tab"), QKeySequence("Ctrl+Shift+Backtab"),
               QKeySequence("Ctrl+PgUp")])


def _shortcut(window: Any, menu: Any, text: str, slot: Any, keys: list[QKeySequence]) -> QAction:
    action = QAction(text, window)
    action.setShortcuts(keys)
    action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
    action.triggered.connect(slot)
    menu.addAction(action)
    return action


def _add_chat_menu(window: Any) -> None:
    menu = window.menuBar().addMenu("&Chat")
    before = next((a for a in window.menuBar().actions() if a.text() == "&Tools"), None)
    if before is not None:  # between Model and Tools, not after Settings
        window.menuBar().insertMenu(before, menu)
    entries = (
        ("Stop reply", lambda: escape(window), QKeySequence(Qt.Key.Key_Escape)),
        # through the buttons: a click on a disabled one (no model loaded, a reply running) does nothing
        ("Regenerate", window.chat_pane.regen_button.click, QKeySequence("Ctrl+R")),
        ("Edit last message", window.chat_pane.edit_button.click, QKeySequence("Ctrl+E")),
        ("Search conversations", lambda: _focus_search(window), QKeySequence(QKeySequence.StandardKey.Find)),
    )
    for text, slot, keys in entries:
        _shortcut(window, menu, text, slot, [keys])


def escape(window: Any) -> None:
    """Esc: stop the reply; else give up an edit in progress."""
    if window.chat.busy:
        window.chat.stop()
    else:
        window.chat_pane.cancel_edit()


def _focus_search(window: Any) -> None:
    window.tabs.setCurrentIndex(0)
    window.sidebar.search.setFocus()
    window.sidebar.search.selectAll()


# -- remembered size ------------------------------------------------------------
def save_window_state(window: QMainWindow) -> None:
    state = {"geometry": bytes(window.saveGeometry().toBase64()).decode()}
    splitter = getattr(window, "splitter", None)
    if splitter is not None:
        state["splitter"] = bytes(splitter.saveState().toBase64()).decode()
    window.settings.window_state = state  # type: ignore[attr-defined]


def restore_window_state(window: QMainWindow) -> None:
    """Restore what :func:`save_window_state` kept; a missing or damaged entry keeps the defaults."""
    state = getattr(window.settings, "window_state", None) or {}  # type: ignore[attr-defined]
    if not isinstance(state, dict):
        return
    if isinstance(state.get("geometry"), str):
        window.restoreGeometry(QByteArray.fromBase64(state["geometry"].encode()))
    splitter = getattr(window, "splitter", None)
    if splitter is not None and isinstance(state.get("splitter"), str):
        splitter.restoreState(QByteArray.fromBase64(state["splitter"].encode()))


# -- live theme -------------------------------------------------------------------
def apply_theme(window: Any) -> Palette:
    """Switch every part of the window to the theme in the settings, now."""
    palette = palette_for(window.settings.theme)
    apply_qt_palette(palette)
    window.palette_ = palette
    for widget in [window, *window.findChildren(QWidget)]:
        if isinstance(getattr(widget, "palette_", None), Palette) and widget is not window:
            widget.palette_ = palette
            if hasattr(widget, "rerender"):
                widget.rerender()  # the transcript: its HTML carries the colours
            widget.update()
    return palette

"""A newcomer's walkthrough of the app, driven with real clicks and keys, written as numbered screenshots.

Run under a virtual screen (one command, about two minutes on two cores):

    xvfb-run -a -s "-screen 0 1920x1080x24" .venv/bin/python scripts/walkthrough.py --out /tmp/walk

It starts the real app on the built-in default model in a throw-away data folder with the hub unreachable
(offline, as ``scripts/screenshot.py`` does), then clicks and types through what someone coming from LM Studio
tries first: the first run, a chat with a streamed reply, an edit that branches (‹1/2›, ‹2/2›), Stop then
Continue, the model library with a search, a filter and a saved preset, the context bar filling up on a small
context, every page (and each Models tab) at 1000×700 and 1920×1080, and a keyboard-only pass (Ctrl+N, type,
Enter, Ctrl+E to edit, Enter, Ctrl+2 and Ctrl+1, F1 for the shortcuts sheet). What each file shows is in
README.md ("Screenshots and the newcomer walkthrough"). The screenshots are for looking at; the layouts are
checked by measuring widgets in tests/app/test_layouts.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import screenshot  # noqa: E402  (sets the throw-away data folder and the offline hub before Qt starts)
from PySide6.QtCore import QPoint, Qt  # noqa: E402
from PySide6.QtTest import QTest  # noqa: E402
from PySide6.QtWidgets import QAbstractButton, QApplication, QWidget  # noqa: E402

pause = screenshot.pause
CTRL = Qt.KeyboardModifier.ControlModifier


class Shots:
    """Numbered PNGs: ``01-first-run.png``, ``02-…``; the whole screen when a dialog is open."""

    def __init__(self, out: Path) -> None:
        self.out, self.n = out, 0
        out.mkdir(parents=True, exist_ok=True)

    def __call__(self, name: str, widget: QWidget | None = None) -> None:
        pause(250)  # let layouts settle and the transcript repaint
        self.n += 1
        path = self.out / f"{self.n:02d}-{name}.png"
        image = widget.grab() if widget is not None else QApplication.primaryScreen().grabWindow(0)
        image.save(str(path))
        print(path.name, flush=True)


def click(button: QAbstractButton) -> None:
    """A real mouse click in the middle of the button (it must be shown and enabled to do anything)."""
    QTest.mouseClick(button, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, button.rect().center())


def key(key_: Qt.Key, modifier: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier) -> None:
    """A key press where the focus is, as a keyboard would send it."""
    if QApplication.activeWindow() is None:  # a dialog just closed (no window manager): the window takes keys again
        window = next(w for w in QApplication.topLevelWidgets() if w.inherits("QMainWindow"))
        window.activateWindow()
        wait_until(lambda: QApplication.activeWindow() is window, 5000)
    target = QApplication.focusWidget() or QApplication.activeWindow()
    QTest.keyClick(target, key_, modifier)


def type_text(text: str) -> None:
    QTest.keyClicks(QApplication.focusWidget(), text)


def wait_for(signal, timeout_ms: int) -> None:  # noqa: ANN001
    """Until ``signal`` fires; a walkthrough that stalls stops here, named, instead of shooting the wrong thing."""
    fired: list = []
    signal.connect(lambda *_args: fired.append(True))
    wait_until(lambda: bool(fired), timeout_ms)


def wait_until(done, timeout_ms: int = 60000) -> None:  # noqa: ANN001
    for _ in range(timeout_ms // 100):
        if done():
            return
        pause(100)
    raise TimeoutError(f"the app did not get there in {timeout_ms} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("walkthrough"))
    args = parser.parse_args()
    shot = Shots(args.out)
    _app = QApplication(sys.argv[:1])  # kept alive for the whole run
    from dataclasses import replace

    from app.application import Services

    services = Services()
    win, settings, client = services.window, services.settings, services.client
    settings.sampling = replace(settings.sampling, temperature=0.0, repeat_penalty=1.0)  # the same run each time
    win.resize(1280, 800)
    win.show()
    win.activateWindow()
    wait_until(lambda: QApplication.activeWindow() is win, 10000)

    # -- first run: the built-in model loads by itself, the message box has the focus
    services.start()
    shot("first-run-loading", win)
    wait_for(client.sig_loaded, 60000)
    shot("first-run-ready", win)

    # -- a chat: typed, sent with the Send button, caught mid-stream and finished
    pane = win.chat_pane
    settings.max_tokens = 120
    click_to_focus(win.composer)
    type_text("What are three uses of copper?")
    shot("chat-typed", win)
    click(pane.send_button)
    wait_for(client.sig_token, 30000)
    pause(400)
    shot("chat-streaming", win)
    wait_for(win.chat.sig_reply_finished, 60000)
    shot("chat-reply", win)

    # -- an edit that branches: Edit last, change the question, send; the old one stays as ‹1/2›
    click(pane.edit_button)
    shot("edit-in-composer", win)
    win.composer.selectAll()
    type_text("What are three uses of tin?")
    click(pane.send_button)
    wait_for(win.chat.sig_reply_finished, 60000)
    shot("edit-branch-2of2", win)
    open_link(win.transcript, "version:0:-1")  # ‹ on the question: the first branch, with its reply
    shot("edit-branch-1of2", win)
    open_link(win.transcript, "version:0:1")

    # -- Stop, then Continue the same reply
    settings.max_tokens = 400
    click_to_focus(win.composer)
    type_text("Tell me a long story about a river.")
    click(pane.send_button)
    wait_for(client.sig_token, 30000)
    pause(1500)
    click(pane.stop_button)
    wait_for(win.chat.sig_reply_finished, 30000)
    shot("stopped-continue-offered", win)
    settings.max_tokens = 60
    click(pane.continue_button)
    wait_for(win.chat.sig_reply_finished, 60000)
    shot("continued", win)

    # -- the library: Ctrl+2, a search, a filter, the built-in model's preset saved
    key(Qt.Key.Key_2, CTRL)
    library = win.models_page.library
    wait_until(lambda: library.entries.count() > 0)
    shot("library", win)
    library.search.setFocus()
    type_text("gemma")
    pause(300)
    shot("library-search", win)
    library.search.clear()
    click(library.mtp_only)
    shot("library-filter-has-mtp", win)
    click(library.mtp_only)
    sections = win.models_page.sections  # the hub searched offline: the built-in catalog answers
    bar = sections.tabBar()
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, bar.tabRect(2).center())
    hub = win.models_page.hub
    hub.query.setFocus()
    type_text("qwen")
    key(Qt.Key.Key_Return)
    wait_until(lambda: hub.status.text().startswith("Offline"), 30000)
    shot("hub-search-offline", win)
    QTest.mouseClick(bar, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, bar.tabRect(0).center())
    library.search.setFocus()
    type_text("gemma")
    wait_until(lambda: library.entries.count() > 0)
    library.entries.setCurrentRow(0)
    click(library.preset_button)
    wait_until(lambda: _preset_dialog() is not None, 5000)
    dialog = _preset_dialog()
    if dialog is not None:
        wait_until(lambda: QApplication.activeWindow() is dialog, 5000)  # keys before that go to the window
        for box in (dialog.ctx_box, dialog.prompt_box):  # Space on a checkable group ticks it
            box.setFocus()
            key(Qt.Key.Key_Space)
        dialog.system_prompt.setFocus()
        type_text("You answer in one short paragraph.")
        shot("preset-sheet")
        ok = next(b for b in dialog.findChildren(QAbstractButton) if b.text().replace("&", "") == "OK")
        click(ok)
    shot("preset-saved", win)
    library.search.clear()

    # -- the context bar filling up: the built-in model reloaded on a 512-token context
    key(Qt.Key.Key_1, CTRL)
    settings.n_ctx = 512
    win.models.load()
    wait_for(client.sig_loaded, 60000)
    key(Qt.Key.Key_N, CTRL)
    settings.max_tokens = 100
    for turn in range(1, 6):
        type_text(f"Question {turn}: describe the river, the sea and the mountain in detail.")
        key(Qt.Key.Key_Return)
        wait_for(win.chat.sig_reply_finished, 60000)
        shot(f"context-bar-turn-{turn}", win)

    # -- every page, and each Models tab, at 1000×700 and 1920×1080
    for w, h in ((1000, 700), (1920, 1080)):
        win.resize(w, h)
        pause(300)
        for index in range(win.tabs.count()):
            win.tabs.setCurrentIndex(index)
            if win.tabs.currentWidget() is win.hardware_page:
                wait_until(lambda: win.hardware_page.report is not None)
            sections = win.models_page.sections if win.tabs.currentWidget() is win.models_page else None
            for section in range(sections.count()) if sections is not None else (None,):
                if sections is not None:
                    sections.setCurrentIndex(section)
                    pause(300)
                name = win.tabs.tabText(index).lower()
                if sections is not None:
                    name += "-" + sections.tabText(section).split()[0].lower()
                shot(f"page-{w}x{h}-{name}", win)
    win.resize(1280, 800)

    # -- keyboard only: a new chat, a send, an edit, a page switch, the shortcuts sheet
    key(Qt.Key.Key_N, CTRL)
    type_text("Name a colour.")
    key(Qt.Key.Key_Return)
    wait_for(win.chat.sig_reply_finished, 60000)
    shot("keys-sent-with-enter", win)
    key(Qt.Key.Key_E, CTRL)
    shot("keys-ctrl-e-edit", win)
    win.composer.selectAll()
    type_text("Name a metal.")
    key(Qt.Key.Key_Return)
    wait_for(win.chat.sig_reply_finished, 60000)
    shot("keys-edited-branch", win)
    key(Qt.Key.Key_Tab)
    shot("keys-tab-leaves-box", win)
    key(Qt.Key.Key_2, CTRL)
    shot("keys-ctrl-2-models", win)
    key(Qt.Key.Key_1, CTRL)
    key(Qt.Key.Key_F1)
    wait_until(lambda: getattr(win, "shortcuts_sheet", None) is not None and win.shortcuts_sheet.isVisible(), 5000)
    shot("keys-f1-shortcuts")
    win.shortcuts_sheet.close()

    services.shutdown()
    print(f"{shot.n} screenshots in {args.out}/")
    return 0


def click_to_focus(widget: QWidget) -> None:
    QTest.mouseClick(widget.viewport() if hasattr(widget, "viewport") else widget, Qt.MouseButton.LeftButton,
                     Qt.KeyboardModifier.NoModifier, QPoint(20, 10))


def open_link(transcript, href: str) -> None:  # noqa: ANN001
    """The transcript's link (a version arrow): a real click where the document draws it."""
    from PySide6.QtGui import QTextCursor

    block = transcript.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref() == href:
                cursor = QTextCursor(transcript.document())
                cursor.setPosition(fragment.position() + fragment.length() // 2)
                transcript.setTextCursor(cursor)
                transcript.ensureCursorVisible()
                QTest.mouseClick(transcript.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                                 transcript.cursorRect(cursor).center())
                return
            it += 1
        block = block.next()
    raise LookupError(f"no link {href} in the transcript")


def _preset_dialog():  # noqa: ANN202
    from app.models.preset_dialog import PresetDialog

    return next((w for w in QApplication.topLevelWidgets() if isinstance(w, PresetDialog) and w.isVisible()), None)


if __name__ == "__main__":
    sys.exit(main())

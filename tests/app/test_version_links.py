"""The ‹ 2/2 › version arrows are big enough to hit: at the text's size (not the footer's small print) and
each at least 20 px wide, and a click on one asks for that version."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.chat.shown_message import ShownMessage
from app.chat.transcript import TranscriptView
from app.theme import LIGHT


def link_rect(view, href: str):
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref() == href:
                start, end = QTextCursor(view.document()), QTextCursor(view.document())
                start.setPosition(fragment.position())
                end.setPosition(fragment.position() + fragment.length())
                a, b = view.cursorRect(start), view.cursorRect(end)
                return a.united(b), fragment.charFormat().font()
            it += 1
        block = block.next()
    raise AssertionError(href)


def test_the_version_arrows_are_large_enough_to_hit(qtbot):
    view = TranscriptView(LIGHT)
    qtbot.addWidget(view)
    view.resize(700, 400)
    view.show()
    view.set_messages([ShownMessage("user", "hello", id=1),
                       ShownMessage("assistant", "the second answer", id=2, version=1, version_count=2)])
    qtbot.wait(50)
    body_size = view.font().pointSizeF()
    for href in ("version:1:-1", "version:1:1"):
        rect, font = link_rect(view, href)
        assert rect.width() >= 20, (href, rect)
        assert font.pointSizeF() >= body_size or font.pixelSize() >= view.fontInfo().pixelSize(), font
    rect, _font = link_rect(view, "version:1:-1")
    with qtbot.waitSignal(view.sig_version) as asked:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert asked.args == [1, -1]

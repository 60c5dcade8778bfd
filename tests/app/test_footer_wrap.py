"""A reply's footer (who wrote it, its tokens, speed and time) wraps between its parts, never inside one: the
walkthrough showed "16.2 tok/s · 4.0" at the end of one line and "s" alone on the next. Measured on the laid-out
document at many widths (which line each part starts and ends on), no pixels compared."""

from __future__ import annotations

import re

from PySide6.QtGui import QTextDocument

from app.chat.shown_message import ShownMessage
from app.chat.transcript import TranscriptView
from app.theme import LIGHT
from engine.speculative.stats import StatsSnapshot

AUTHOR = "built-in model · temperature 0 · off"


def line_of(doc: QTextDocument, position: int) -> tuple[int, int]:
    """(block, line in that block) where the character at ``position`` is laid out."""
    block = doc.findBlock(position)
    line = block.layout().lineForTextPosition(position - block.position())
    return block.blockNumber(), line.lineNumber()


def split_parts(view: TranscriptView, parts: list[str]) -> list[str]:
    doc = view.document()
    raw = doc.toRawText()  # one character per document position: no-break spaces and word joiners kept
    broken = []
    for part in parts:
        pattern = "".join("[ \u00a0]" if c == " " else "/\u2060?" if c == "/" else re.escape(c) for c in part)
        found = re.search(pattern, raw)
        assert found is not None, f"{part!r} is not in the transcript"
        if line_of(doc, found.start()) != line_of(doc, found.end() - 1):
            broken.append(part)
    return broken


def test_the_footer_wraps_between_its_parts_never_inside_one(qtbot):
    view = TranscriptView(LIGHT)
    qtbot.addWidget(view)
    reply = ShownMessage("assistant", "Copper is a metal.", "stopped",
                         StatsSnapshot(generated_tokens=120, decode_tps=16.2, elapsed=7.5))
    reply.written_by = AUTHOR
    reply.id = 2
    view.set_messages([ShownMessage("user", "Copper?"), reply])
    view.show()
    plain = view.toPlainText()
    footer = plain[plain.index("built-in model"):].strip().replace("\u2060", "")
    parts = [p.strip() for p in footer.replace("\u00a0", " ").replace("\u2060", "").split("·") if " " in p.strip()]
    assert any("tok/s" in p for p in parts) and any(p.endswith(" s") for p in parts), footer
    broken: set[str] = set()
    wrapped_somewhere = False
    for width in range(260, 900, 2):
        view.resize(width, 400)
        view.document().setTextWidth(view.viewport().width())
        doc = view.document()
        cursor = doc.find(footer.split(" ")[0])
        end = doc.find(footer.split(" ")[-1], cursor.position())
        wrapped_somewhere |= line_of(doc, cursor.selectionStart()) != line_of(doc, end.selectionEnd() - 1)
        broken.update(split_parts(view, parts))
    assert wrapped_somewhere, "the footer never wrapped: the widths tried do not test anything"
    assert not broken, f"footer parts split across lines: {sorted(broken)}"

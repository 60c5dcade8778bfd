"""The transcript's incremental streaming shows everything and ends exactly
as a whole render of the reply."""

from __future__ import annotations

import random

from app.chat.transcript import ShownMessage, TranscriptView, settle_point
from app.theme import LIGHT
from engine.speculative.stats import StatsSnapshot

REPLY = (
    "Here is a **plan**:\n\n- read the file\n- count the words\n\nThe code:\n\n"
    "```python\ndef count(path):\n\n    return len(open(path).read().split())\n```\n\n"
    "That is all. A second block:\n\n```c\nint x = 1;\n```\n\nDone, `count` returns an int."
)


def test_paragraphs_settle_only_outside_code_fences():
    text = "a\n\n```\nx\n\ny\n```\n\nb"
    assert settle_point(text, 0) == text.index("```\n\nb") + 5
    assert settle_point("no break yet", 0) == 0
    assert settle_point("```\nopen fence\n\nstill code", 0) == 0


def test_streaming_in_random_pieces_ends_like_a_whole_render(qtbot):
    view = TranscriptView(LIGHT)
    qtbot.addWidget(view)
    view.set_messages([ShownMessage("user", "Plan it")])
    view.begin_reply()
    rng = random.Random(3)
    i = 0
    while i < len(REPLY):
        n = rng.randint(1, 9)
        view.append_reply(REPLY[i:i + n], from_draft=False)
        i += n
        view._flush()
        # everything that arrived is on screen, Markdown or not
        shown = view.toPlainText().replace(" ", "").replace("\n", "").replace("Copy", "")
        assert REPLY[:i].split()[-1].strip("`*") in shown
    view.end_reply("complete", StatsSnapshot(generated_tokens=42, elapsed=1.0))
    streamed = view.toPlainText()

    whole = TranscriptView(LIGHT)
    qtbot.addWidget(whole)
    whole.set_messages([ShownMessage("user", "Plan it"),
                        ShownMessage("assistant", REPLY, "complete", StatsSnapshot(generated_tokens=42, elapsed=1.0))])
    assert streamed == whole.toPlainText()
    assert "42 tokens" in streamed and "def count(path):" in streamed and "**" not in streamed

"""The transcript's incremental streaming shows everything and ends exactly
as a whole render of the reply."""

from __future__ import annotations

import random

from app.chat.markdown import settle_point
from app.chat.shown_message import ShownMessage
from app.chat.transcript import TranscriptView
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


def test_markdown_renders_tables_links_nested_lists_and_code_blocks(qtbot):
    from app.chat import markdown

    text = ("| Metal | Use |\n|---|---|\n| copper | wires |\n| tin | cans |\n\n"
            "See [the docs](https://example.org/a?b=1) and <b>raw html</b>.\n\n"
            "- fruit\n  - apple\n  - pear\n- veg\n\n"
            "```rust\nfn main() { let x = 1; }\n```\n\n"
            "~~~\nplain tilde block\n~~~\n")
    out = markdown.render(text, LIGHT.code_palette(), copy_prefix="copy:0:")
    assert "<table" in out and "<td>copper</td>" in out and "<th>Metal</th>" in out
    assert '<a href="https://example.org/a?b=1">the docs</a>' in out
    assert "&lt;b&gt;raw html&lt;/b&gt;" in out  # the model's output is never HTML
    assert out.count("<ul>") == 2  # the nested list is a list inside a list
    assert 'href="copy:0:0"' in out and 'href="copy:0:1"' in out
    assert "<span" in out and "fn" in out  # Pygments coloured the Rust
    assert markdown.code_blocks(text) == ["fn main() { let x = 1; }", "plain tilde block"]
    view = TranscriptView(LIGHT)
    qtbot.addWidget(view)
    view.set_messages([ShownMessage("assistant", text)])
    shown = view.toPlainText()
    assert "copper" in shown and "apple" in shown and "[the docs]" not in shown and "|---|" not in shown


def test_markdown_knows_many_languages_and_keeps_unknown_ones_plain():
    from app.chat import markdown

    haskell = markdown.highlight_code("main = putStrLn \"hi\" -- greet", LIGHT.code_palette(), "haskell")
    assert "<span" in haskell and "-- greet" in haskell
    assert markdown.highlight_code("a < b", LIGHT.code_palette(), "no-such-language") == "a &lt; b"
    # a javascript: link is not made clickable
    assert 'href="javascript' not in markdown.render("[x](javascript:alert(1))", LIGHT.code_palette())


def test_a_wide_transcript_keeps_a_readable_line_width_and_a_narrow_one_uses_all_of_it(qtbot):
    view = TranscriptView(LIGHT)
    qtbot.addWidget(view)
    view.set_messages([ShownMessage("assistant", "word " * 600)])
    view.resize(1900, 700)
    view.show()
    qtbot.wait(20)
    assert view.max_line_px() - 40 <= view.viewport().width() <= view.max_line_px()
    assert view.viewportMargins().left() == view.viewportMargins().right() > 300
    view.resize(500, 600)
    qtbot.wait(20)
    assert view.viewportMargins().left() == 0 and view.viewport().width() > 450

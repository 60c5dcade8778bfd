"""A chat's title is its first message in plain words, without Markdown's marks (the real worker answers
the message that names the chat)."""

from __future__ import annotations

from app.chat.titles import title_from
from tests.app.conftest import send_and_wait, start_and_load


def test_markdown_marks_are_taken_off_the_title():
    assert title_from("## Fix the **parser**") == "Fix the parser"
    assert title_from("- [ ] `ls -la` fails in [the docs](https://example.com)") == "ls -la fails in the docs"
    assert title_from("> quoted _idea_ here") == "quoted idea here"
    assert title_from("```python\nprint('hi')\n```") == "print('hi')"
    assert title_from("\n\n1. first step\n2. second") == "first step"
    assert title_from("snake_case_name stays") == "snake_case_name stays"
    assert title_from("x" * 60) == "x" * 48 + "…"
    assert title_from("```\n```") == "New chat"


def test_a_new_chat_is_titled_in_plain_words(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 4
    send_and_wait(qtbot, window, "# **Why** is `the river` *blue*?")
    assert services.store.get(window.chat.conversation_id).title == "Why is the river blue?"

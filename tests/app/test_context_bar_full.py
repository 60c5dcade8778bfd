"""The context bar when a reply ran to the context's very end, as in the walkthrough (five turns on 512 tokens):
it read "513 / 512 tokens of context (100%) · nearly full" (the reply's last token is counted but never took a
slot). Now it never counts past the context and says it is full; the label and the bar stay inside the row."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect


def test_a_context_run_to_its_end_reads_full_never_more_than_the_size(qtbot, services):
    window = services.window
    window.resize(1000, 700)
    window.show()
    qtbot.waitExposed(window)
    window.chat.model_loaded(512)
    bar = window.chat_pane.context_bar
    bar._set(513, estimated=False)  # prompt 492 + 21 generated: what the reply's statistics said
    qtbot.wait(20)
    text = bar.label.text()
    assert text.startswith("512 / 512 tokens of context (100%)"), text
    assert "full: the next reply leaves out the oldest messages" in text and "nearly" not in text, text
    row = QRect(QPoint(0, 0), bar.size())
    for part in (bar.label, bar.bar):
        assert row.contains(part.geometry()), (part, part.geometry(), row)
    # the layout settles in the event loop: on a busy machine later than a fixed wait (a deadline, not a pause)
    qtbot.waitUntil(lambda: bar.label.height() >= bar.label.heightForWidth(bar.label.width()), timeout=5000)
    assert bar.bar.width() >= 60, "the label squeezed the bar away"
    bar._set(470, estimated=False)
    assert "nearly full" in bar.label.text() and bar.label.text().startswith("470 / 512")


def test_a_long_context_label_never_squeezes_the_chat_list(qtbot, services):
    """At 1000×700 the walkthrough's chat list was ~90 px wide ("Search con…", "What are th…"): the context
    bar's one-line label ("… · nearly full: the oldest messages will be left out") set the chat pane's minimum
    width. The label wraps instead; the window and the chat list keep their widths and the label is read whole."""
    window = services.window
    window.resize(1000, 700)
    window.show()
    qtbot.waitExposed(window)
    window.chat.model_loaded(512)
    bar = window.chat_pane.context_bar
    bar._set(10, estimated=False)
    qtbot.wait(20)
    before = window.sidebar.width()
    for used in (470, 513):
        bar._set(used, estimated=False)
        qtbot.wait(20)
        assert window.width() == 1000 and window.sidebar.width() == before, (used, window.sidebar.width(), before)
        label = bar.label
        assert label.height() >= label.heightForWidth(label.width()), "the label's wrapped lines are cut"

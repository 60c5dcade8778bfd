"""Branching edits, Continue and the context bar against the real worker on the built-in model."""

from __future__ import annotations

from PySide6.QtCore import QUrl

from tests.app.conftest import send_and_wait, start_and_load


def send(qtbot, window, text: str) -> None:
    send_and_wait(qtbot, window, text)


def test_an_edit_branches_and_the_old_branch_comes_back_with_its_reply(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 6
    send(qtbot, window, "The river")
    first = [m.content for m in store.messages(window.chat.conversation_id)]
    window.chat_pane.edit_button.click()
    send_and_wait(qtbot, window, "The mountain")
    conv = window.chat.conversation_id
    second = [m.content for m in store.messages(conv)]
    assert second[0] == "The mountain" and second[1] and len(second) == 2
    assert "2/2" in window.transcript.toPlainText()
    window.transcript._on_anchor(QUrl("version:0:-1"))
    assert [m.content for m in store.messages(conv)] == first
    assert "1/2" in window.transcript.toPlainText() and first[1].strip() in window.transcript.toPlainText()


def test_continue_after_the_length_limit_appends_to_the_same_reply(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 8
    send(qtbot, window, "Once upon a time")
    conv = window.chat.conversation_id
    cut = store.messages(conv)[1]
    assert cut.stats["generated_tokens"] == 8
    assert window.chat_pane.continue_button.isVisibleTo(window) and "Continue" in window.transcript.toPlainText()
    asked: list = []
    services.client.sig_stats.connect(lambda ev: asked.append(ev.stats))
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000) as finished:
        window.chat_pane.continue_button.click()
    assert finished.args == ["complete"]
    msgs = store.messages(conv)
    assert [m.role for m in msgs] == ["user", "assistant"] and msgs[1].id == cut.id
    assert msgs[1].content.startswith(cut.content) and len(msgs[1].content) > len(cut.content)
    assert msgs[1].stats["prompt_tokens"] > cut.stats["prompt_tokens"]  # the reply so far was in the prompt
    assert window.transcript.messages[-1].content == msgs[1].content


def test_continue_after_stop_goes_on_from_the_stopped_text(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 400
    window.composer.setPlainText("Once upon a time")
    with qtbot.waitSignal(services.client.sig_token, timeout=60000):
        window.send()
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=30000) as stopped:
        window.chat.stop()
    assert stopped.args == ["cancelled"]
    conv = window.chat.conversation_id
    before = store.messages(conv)[1].content
    assert window.chat_pane.continue_button.isVisibleTo(window)
    services.settings.max_tokens = 5
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.chat_pane.continue_button.click()
    after = store.messages(conv)[1]
    assert after.content.startswith(before) and len(after.content) > len(before) and after.status == "complete"


def test_the_context_bar_counts_the_conversation_against_the_loaded_context(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    bar = window.chat_pane.context_bar
    services.settings.max_tokens = 6
    finals: list = []
    services.client.sig_done.connect(lambda ev: finals.append(ev.stats))
    send(qtbot, window, "The river runs to the sea")
    n_ctx = window.chat.context_size
    assert bar.isVisibleTo(window) and n_ctx > 0
    used = finals[-1].prompt_tokens + finals[-1].generated_tokens
    assert bar.used == used and bar.bar.value() == used and bar.bar.maximum() == n_ctx
    assert f"{used:,} / {n_ctx:,} tokens" in bar.label.text() and not bar.estimated
    conv = window.chat.conversation_id
    window.chat.new_conversation()
    assert bar.used == 0
    with qtbot.waitSignal(services.client.sig_tokens, timeout=30000):
        window.chat.open(conv)  # counted by the worker's tokenizer
    assert bar.estimated and abs(bar.used - used) <= 3 and "about" in bar.label.text()  # no template here


def test_continue_follows_the_reply_version_shown(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    continue_button = window.chat_pane.continue_button
    services.settings.max_tokens = 400
    window.composer.setPlainText("Once upon a time")
    with qtbot.waitSignal(services.client.sig_token, timeout=60000):
        window.send()
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=30000):
        window.chat.stop()  # version 1: stopped, so it can be continued
    services.settings.max_tokens = 8
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.chat_pane.regen_button.click()  # version 2: 8 tokens
    services.settings.max_tokens = 400  # now 8 tokens is a reply that ended by itself: nothing to continue
    window.transcript._on_anchor(QUrl("version:1:-1"))
    assert "1/2" in window.transcript.toPlainText() and continue_button.isVisibleTo(window)
    window.transcript._on_anchor(QUrl("version:1:1"))
    assert "2/2" in window.transcript.toPlainText()
    assert not continue_button.isVisibleTo(window), "Continue stayed from the version shown before"


def test_switching_a_branch_brings_its_title_and_statistics(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 6
    send(qtbot, window, "The river")
    river = store.messages(window.chat.conversation_id)[1].stats
    window.chat_pane.edit_button.click()
    services.settings.max_tokens = 3  # the other branch's reply is another length: its statistics differ
    send_and_wait(qtbot, window, "The mountain")
    conv = window.chat.conversation_id
    listed = window.sidebar.list.currentIndex()
    assert store.get(conv).title == "The mountain" and listed.data() == "The mountain"
    assert window.stats_panel.stats.generated_tokens == 3
    window.transcript._on_anchor(QUrl("version:0:-1"))  # ‹ on the question: the river's branch
    assert store.get(conv).title == "The river"
    assert window.sidebar.list.currentIndex().data() == "The river"  # the chat list follows it
    assert window.stats_panel.stats.generated_tokens == river["generated_tokens"] == 6
    assert window.stats_panel.final
    window.transcript._on_anchor(QUrl("version:0:1"))
    assert window.sidebar.list.currentIndex().data() == "The mountain"
    assert window.stats_panel.stats.generated_tokens == 3
    store.update(conv, title="My own name")  # a title the user gave is kept whatever branch shows
    window.transcript._on_anchor(QUrl("version:0:-1"))
    assert store.get(conv).title == "My own name"


def test_switching_a_replys_version_brings_its_statistics(qtbot, services):
    start_and_load(qtbot, services)
    window = services.window
    services.settings.max_tokens = 6
    send(qtbot, window, "The river")
    services.settings.max_tokens = 3
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.chat_pane.regen_button.click()
    assert window.stats_panel.stats.generated_tokens == 3
    window.transcript._on_anchor(QUrl("version:1:-1"))  # ‹ on the reply: its first version
    assert "1/2" in window.transcript.toPlainText()
    assert window.stats_panel.stats.generated_tokens == 6 and window.stats_panel.final
    window.transcript._on_anchor(QUrl("version:1:1"))
    assert window.stats_panel.stats.generated_tokens == 3


def test_a_continued_replys_footer_counts_the_whole_reply_and_labels_the_last_parts_speed(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 8
    send(qtbot, window, "Once upon a time")
    conv = window.chat.conversation_id
    services.settings.max_tokens = 5
    for whole in (13, 18):  # 8, then 5 more, then 5 more
        with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
            window.chat_pane.continue_button.click()
        assert store.messages(conv)[1].stats["generated_tokens"] == 5  # the statistics stored are the last part's
        for _reopened in (False, True):
            footer = window.transcript.toPlainText().splitlines()[-1]
            assert f"{whole} tokens" in footer and "continued" in footer, footer
            assert "last part: 5 tokens" in footer and footer.index("last part") < footer.index("tok/"), footer
            window.chat.open(conv)

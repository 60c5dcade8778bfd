"""Each reply says which model and settings wrote it (file name, sampling preset, speculative settings), in
its footer as it ends and after the chat is opened again, each version its own; the statistics still read
(real worker, built-in model, then a synthetic MTP model)."""

from __future__ import annotations

import json

from PySide6.QtGui import QColor

from app.chat.written_by import KEY, segments_of, spans_of, split
from engine.sampling import PRESETS
from engine.speculative.settings import mtp
from tests.app.conftest import send_and_wait, start_and_load
from tests.engine.conftest import synth


def footer_of_last(window) -> str:
    return window.transcript.toPlainText().strip().splitlines()[-1]


def test_a_reply_names_the_model_and_settings_that_wrote_it(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 6
    send_and_wait(qtbot, window, "The river")
    conv = window.chat.conversation_id
    foot = footer_of_last(window)
    assert "built-in model · temperature 0 · off" in foot and "6 tokens" in foot
    stored = store.messages(conv)[1].stats
    assert stored[KEY] == {"model": "built-in model", "sampling": "temperature 0"}
    window.chat.open(conv)  # as after a restart
    assert "built-in model · temperature 0 · off" in footer_of_last(window) and "6 tokens" in footer_of_last(window)
    raw, author = split(stored)
    assert KEY not in raw and author["model"] == "built-in model"
    json.dumps(stored)  # plain JSON


def test_another_model_and_version_each_keep_their_own(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 6
    send_and_wait(qtbot, window, "The river")
    conv = window.chat.conversation_id
    services.settings.sampling = PRESETS["balanced"]  # the next version with a preset's sampling
    path = synth("glm4moe").path("combined")
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000):
        window.models.use(str(path), "")
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.chat.regenerate()  # the second version, by the other model
    assert f"{path.name} · balanced sampling" in footer_of_last(window)
    window.chat.show_version(1, -1)
    assert "built-in model · temperature 0" in footer_of_last(window)
    assert store.messages(conv)[1].stats[KEY]["model"] == "built-in model"


def test_the_draft_highlight_survives_opening_the_chat_again(qtbot, services):
    services.settings.model_path = str(synth("qwen35", "oracle", agree=0.95).path())
    services.settings.speculative = "auto"
    services.settings.max_tokens = 60
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    window.chat.profile_speculative = mtp(3)
    window.highlight_box.setChecked(True)
    window.composer.setPlainText("the river model")
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=120000):
        window.send()
    live = list(window.transcript.messages[-1].segments)
    assert any(drafted for _t, drafted in live), live  # some text came from accepted drafts
    conv = window.chat.conversation_id
    assert store.messages(conv)[1].stats["draft_spans"]
    window.chat.open(conv)  # as after a restart
    assert window.transcript.messages[-1].segments == live
    assert window.transcript.toHtml().count(QColor(window.palette_.draft_bg).name()) >= 1
    window.highlight_box.setChecked(False)
    assert QColor(window.palette_.draft_bg).name() not in window.transcript.toHtml()


def test_spans_and_segments_round_trip_and_bad_spans_cost_only_themselves():
    segments = [("The ", False), ("river ", True), ("runs", False), (" on", True)]
    content = "".join(t for t, _d in segments)
    assert segments_of(content, {"draft_spans": [list(s) for s in spans_of(segments)]}) == segments
    assert segments_of(content, {}) == [(content, False)]
    assert segments_of(content, {"draft_spans": [[4, 10], "bad", [90, 99]]}) == [("The ", False),
                                                                                 ("river ", True),
                                                                                 ("runs on", False)]

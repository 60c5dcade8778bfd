"""Each reply says which model and settings wrote it (file name, sampling preset, speculative settings), in
its footer as it ends and after the chat is opened again, each version its own; the statistics still read
(real worker, built-in model, then a synthetic MTP model)."""

from __future__ import annotations

import json

from app.chat.written_by import KEY, split
from engine.sampling import PRESETS
from tests.app.conftest import start_and_load
from tests.engine.conftest import synth


def footer_of_last(window) -> str:
    return window.transcript.toPlainText().strip().splitlines()[-1]


def test_a_reply_names_the_model_and_settings_that_wrote_it(qtbot, services):
    start_and_load(qtbot, services)
    window, store = services.window, services.store
    services.settings.max_tokens = 6
    window.composer.setPlainText("The river")
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.send()
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
    window.composer.setPlainText("The river")
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.send()
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

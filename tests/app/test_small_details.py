"""Small things a newcomer meets at once (issue 30, "small but constant"):
buttons that do nothing in an empty chat, a thread hint that argued with its
own default, "GPU offload yes" on a machine without one, and autotune labels
cut to another setting's name."""

from __future__ import annotations

import json

from app.autotune_chart import SpeedChart
from app.hardware_page import HardwarePage
from app.hardware_probe import HardwareProbe
from app.settings import Settings
from app.settings_dialog import SettingsDialog
from app.theme import LIGHT
from engine.hardware import default_threads
from engine.speculative.settings import SPECULATION_OFF, mtp, ngram
from tests.app.conftest import send_and_wait, start_and_load


def test_regenerate_and_edit_are_disabled_until_the_chat_has_a_message(qtbot, services):
    start_and_load(qtbot, services)  # a model is loaded: nothing else holds the buttons back
    window = services.window
    pane = window.chat_pane
    assert window.send_button.isEnabled()
    assert not pane.regen_button.isEnabled() and not pane.edit_button.isEnabled()
    assert "no message yet" in pane.regen_button.toolTip()
    services.settings.max_tokens = 8
    send_and_wait(qtbot, window, "Hello")
    assert pane.regen_button.isEnabled() and pane.edit_button.isEnabled()
    asked = window.chat.conversation_id
    window.conversation_list.new_chat()
    assert window.chat.conversation_id != asked
    assert not pane.regen_button.isEnabled() and not pane.edit_button.isEnabled()
    window.chat.open(asked)  # back to the chat with a message: both work again
    assert pane.regen_button.isEnabled() and pane.edit_button.isEnabled()


def test_the_thread_hint_explains_the_default_in_the_box(qtbot, isolated_dirs):
    dialog = SettingsDialog(Settings(), max_draft=3)
    qtbot.addWidget(dialog)
    shown = dialog.threads.value()
    assert shown == default_threads()
    hint = dialog.threads_hint.text()
    assert "Every core is usually fastest" not in hint
    if shown > 1 or "one core" not in hint:
        assert f"The default, {shown} of" in hint, hint


def test_the_hardware_page_says_no_gpu_offload_without_a_gpu_device(qtbot):
    page = HardwarePage(HardwareProbe())
    qtbot.addWidget(page)
    page.refresh()
    qtbot.waitUntil(lambda: page.report is not None, timeout=60000)
    devices = page.report.engine_devices
    shown = page.summary.text()
    if not any(d.type in ("gpu", "igpu") for d in devices):  # this project's machines: a CPU-only build
        assert "GPU offload yes" not in shown, shown
        assert "GPU offload no" in shown, shown
    else:
        assert "GPU offload yes" in shown, shown


def test_autotune_chart_labels_are_never_cut(qtbot):
    chart = SpeedChart(LIGHT)
    qtbot.addWidget(chart)
    chart.resize(700, 260)  # the wizard's chart at its default size
    labels = [s.label for s in (SPECULATION_OFF, mtp(3), mtp(3, p_min=0.5), mtp(6, p_min=0.25, depth="adaptive"),
                                  ngram(8, mtp_too=True))]
    for i, label in enumerate(labels):
        chart.set_ratio(label, 0.8 + 0.1 * i)
    chart.grab()
    room = chart.label_width() - SpeedChart.LABEL_PAD - 4  # the label column less its padding
    for label in labels:
        assert chart.fontMetrics().horizontalAdvance(label) <= room, (label, room)
    assert "mtp adaptive n_max=6 p_min=0.25" in labels  # the longest, read in full


def test_the_draft_vocabulary_chosen_in_preferences_asks_for_a_reload_and_reaches_the_load(qtbot):
    from app.load_choice import LoadChoice

    settings = Settings()
    dialog = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(dialog)
    assert dialog.draft_vocab.currentData() == 0
    assert not dialog.apply()  # nothing changed
    dialog.draft_vocab.setCurrentIndex(dialog.draft_vocab.findData(32_768))
    assert dialog.apply()  # the MTP context is made with it: a reload
    assert settings.draft_vocab_for(None) == 32_768
    assert LoadChoice.from_settings(settings).options(settings).draft_vocab == 32_768
    settings.set_draft_vocab(None, 40_000)  # from elsewhere (a hand-edited file): shown as it is, kept on OK
    again = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(again)
    assert again.draft_vocab.currentText() == "The first 40,000 tokens"
    assert not again.apply() and settings.draft_vocab_for(None) == 40_000


def test_each_model_keeps_its_own_draft_vocabulary(qtbot, tmp_path, monkeypatch):
    """A cut chosen for a 151,936-token model must not reach a small-vocabulary one loaded next; a file
    from before (one draft_vocab for all) gives it to the model it was saved with."""
    from app.load_choice import LoadChoice

    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path / "config"))
    settings = Settings(model_path="/models/qwen-152k.gguf")
    dialog = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(dialog)
    dialog.draft_vocab.setCurrentIndex(dialog.draft_vocab.findData(32_768))
    assert dialog.apply()
    other = LoadChoice("/models/small-32k.gguf", None, 4096, 1, 0, True)
    assert other.options(settings).draft_vocab == 0  # another model drafts among all its tokens
    settings.model_path = other.path
    shown = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(shown)
    assert shown.draft_vocab.currentData() == 0 and not shown.apply()
    assert LoadChoice("/models/qwen-152k.gguf", None, 4096, 1, 0, True).options(settings).draft_vocab == 32_768
    settings.save()
    assert Settings.load().draft_vocabs == {"/models/qwen-152k.gguf": 32_768}

    Settings.path().write_text(json.dumps({"model_path": "/models/qwen-152k.gguf", "draft_vocab": 65_536}))
    old, notices = Settings.read()
    assert notices == [] and old.draft_vocabs == {"/models/qwen-152k.gguf": 65_536}
    Settings.path().write_text(json.dumps({"draft_vocabs": {"/m.gguf": True, "/n.gguf": 70_000}, "n_ctx": 8192}))
    bad, notices = Settings.read()  # a value that is no token count: that field alone is reset
    assert bad.draft_vocabs == {} and bad.n_ctx == 8192 and "draft_vocabs" in notices[0]


def test_the_status_bar_names_a_cut_draft_vocabulary_and_the_replies_at_once():
    from app.engine_status import model_details, model_text
    from engine.worker.events import ModelInfo

    whole = ModelInfo(path="/m/qwen.gguf", architecture="qwen35", n_vocab=151_936, mtp="single",
                      draft_vocab=151_936, n_seq=1)
    assert model_text(whole) == "qwen.gguf · MTP: 1 head" and model_details(whole) == "/m/qwen.gguf"
    cut = ModelInfo(path="/m/qwen.gguf", architecture="qwen35", n_vocab=151_936, mtp="single",
                    draft_vocab=32_768, n_seq=4)
    assert model_text(cut) == "qwen.gguf · MTP: 1 head"  # the bar stays short: the window fits small screens
    assert model_details(cut) == ("/m/qwen.gguf\nThe MTP head drafts among the first 32,768 of 151,936 tokens.\n"
                                  "Decodes 4 replies at once (the chat's and the local server's).")
    auto = ModelInfo(path="/m/qwen.gguf", architecture="qwen35", n_seq=2,
                     parallel_reason="2 requests at once (4 sequences of 4096 tokens would not fit in 6.0 GiB of "
                                     "NVIDIA GeForce RTX 4060's memory and 20.0 GiB of RAM; 2 need ~5.2 GiB on "
                                     "NVIDIA GeForce RTX 4060 and ~0.3 GiB in RAM; --parallel N to choose)")
    assert model_details(auto).splitlines()[-1] == (
        "Replies at once (Auto): 2 requests at once (4 sequences of 4096 tokens would not fit in 6.0 GiB of NVIDIA "
        "GeForce RTX 4060's memory and 20.0 GiB of RAM; 2 need ~5.2 GiB on NVIDIA GeForce RTX 4060 and ~0.3 GiB in "
        "RAM)")


def test_memory_for_earlier_conversations_is_a_preference_that_persists_and_reaches_the_load(qtbot, isolated_dirs):
    from app.load_choice import LoadChoice

    settings = Settings()
    dialog = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(dialog)
    assert dialog.state_cache.value() == 2048  # the engine's default (LoadOptions.state_cache_mib)
    dialog.state_cache.setValue(512)
    assert dialog.apply()  # the budget is the session's: a reload
    settings.save()
    again = Settings.load()
    assert again.state_cache_mib == 512
    assert LoadChoice.from_settings(again).options(again).state_cache_mib == 512


def test_a_sliding_window_model_s_whole_cache_is_a_preference_that_persists_and_reaches_the_load(qtbot,
                                                                                             isolated_dirs):
    from app.load_choice import LoadChoice

    settings = Settings()
    dialog = SettingsDialog(settings, max_draft=3)
    qtbot.addWidget(dialog)
    assert not dialog.swa_full.isChecked()  # the engine's default: the window's cells only
    assert not dialog.apply()
    dialog.swa_full.setChecked(True)
    assert dialog.apply()  # the context's cache is made at load: a reload
    settings.save()
    again = Settings.load()
    assert again.swa_full
    assert LoadChoice.from_settings(again).options(again).swa_full

"""Sampling presets and plain-word settings, prompt progress, and the
statistics panel stating what MTP gains (only where it was measured)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

from PySide6.QtWidgets import QFormLayout, QLabel, QWidget

from app.reply_fields import ReplyFields
from app.reply_values import ReplyValues, effective
from app.settings import Settings
from app.settings_dialog import SettingsDialog
from engine.sampling import BALANCED, PRECISE, RANDOM_SEED, sampling_key
from engine.speculative.settings import mtp
from tests.app.conftest import send_and_wait, start_and_load
from tests.engine.conftest import synth


def fields(qtbot, values: ReplyValues | None = None, **kw) -> ReplyFields:
    host = QWidget()
    qtbot.addWidget(host)
    f = ReplyFields(QFormLayout(host), values or Settings().reply_values(), 8, **kw)
    f.host = host  # the widgets live as long as the fields
    return f


def test_presets_fill_the_fields_and_an_edit_makes_them_custom(qtbot):
    f = fields(qtbot)
    assert f.preset.currentData() == "balanced" and f.temperature.value() == BALANCED.temperature
    assert f.repeat_penalty.value() == BALANCED.repeat_penalty
    f.preset.setCurrentIndex(f.preset.findData("precise"))
    assert f.temperature.value() == 0.0 and f.repeat_penalty.value() == PRECISE.repeat_penalty
    f.top_p.setValue(0.5)
    assert f.preset.currentData() == "custom"
    values = f.values()
    assert values.sampling == replace(PRECISE, top_p=0.5) and values.sampling.seed == RANDOM_SEED
    assert f.seed.text() == "random"  # the engine's RANDOM_SEED
    f.seed.setValue(7)
    assert f.values().sampling.seed == 7


def test_labels_are_plain_words_and_tooltips_name_llama_cpp(qtbot):
    f = fields(qtbot)
    form = f.host.layout()
    items = [form.itemAt(i, QFormLayout.ItemRole.LabelRole) for i in range(form.rowCount())]
    words = [item.widget().text() for item in items if item is not None and isinstance(item.widget(), QLabel)]
    assert "Randomness" in words and "Draft depth" in words
    assert not any(name in text for text in words for name in ("n_max", "p_min", "top_k", "temperature"))
    for box, flag in ((f.temperature, "--temp"), (f.top_k, "--top-k"), (f.top_p, "--top-p"), (f.min_p, "--min-p"),
                      (f.repeat_penalty, "--repeat-penalty"), (f.presence_penalty, "--presence-penalty"),
                      (f.frequency_penalty, "--frequency-penalty"), (f.seed, "--seed"),
                      (f.n_max, "--spec-draft-n-max"), (f.p_min, "--spec-draft-p-min")):
        assert flag in box.toolTip()


def test_preferences_show_the_depth_autotune_applied(qtbot):
    settings = Settings(speculative="auto", n_max=3, p_min=0.0)
    dialog = SettingsDialog(settings, 8, auto=mtp(2, p_min=0.3), auto_speedup=1.4)
    qtbot.addWidget(dialog)
    r = dialog.reply
    assert (r.n_max.value(), r.p_min.value(), r.n_max.isEnabled()) == (2, 0.3, False)
    assert "Autotune chose draft depth 2" in r.auto_note.text() and "1.4× faster" in r.auto_note.text()
    assert r.values().n_max == 3  # the user's own choice is kept, not overwritten by autotune's
    r.speculative.setCurrentText("mtp")
    assert (r.n_max.value(), r.n_max.isEnabled(), r.auto_note.text()) == (3, True, "")


def test_old_settings_files_load_and_their_untouched_greedy_default_becomes_balanced(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path))
    old = {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "n_max": 2, "max_tokens": 100}
    (tmp_path / "settings.json").write_text(json.dumps(old))
    s = Settings.load()
    assert (s.sampling, s.n_max, s.max_tokens) == (BALANCED, 2, 100)
    (tmp_path / "settings.json").write_text(json.dumps({**old, "temperature": 1}))  # chosen, and an int
    s = Settings.load()
    assert s.sampling.temperature == 1.0 and isinstance(s.sampling.temperature, float)


def test_sampling_is_saved_as_one_value_and_flat_files_from_before_read_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_STUDIO_CONFIG_DIR", str(tmp_path))
    chosen = replace(BALANCED, temperature=0.8, top_k=12, seed=42)
    Settings(sampling=chosen).save()
    saved = json.loads((tmp_path / "settings.json").read_text())
    assert saved["sampling"] == asdict(chosen) and "temperature" not in saved
    assert Settings.load().sampling == chosen
    flat = {"sampling_preset": "custom", **asdict(chosen), "seed": -1, "max_tokens": 64}  # as written before
    (tmp_path / "settings.json").write_text(json.dumps(flat))
    s = Settings.load()
    assert (s.sampling, s.max_tokens) == (replace(chosen, seed=RANDOM_SEED), 64)  # -1 was "random"


def test_a_chat_stored_flat_or_nested_goes_over_the_preferences_field_by_field():
    preferences = Settings(sampling=BALANCED, max_tokens=300).reply_values()
    old_chat = {"sampling_preset": "custom", **asdict(PRECISE), "seed": -1, "max_tokens": 20, "speculative": "off"}
    values = effective(preferences, old_chat)
    assert (values.sampling, values.max_tokens, values.speculative) == (PRECISE, 20, "off")
    older = {"temperature": 0.3, "max_tokens": 20}  # saved before the other fields existed
    assert effective(preferences, older).sampling == replace(BALANCED, temperature=0.3)
    nested = {"sampling": asdict(replace(PRECISE, seed=9)), "max_tokens": 20, "speculative": "mtp", "n_max": 2,
              "p_min": 0.0}
    assert effective(preferences, nested) == ReplyValues(replace(PRECISE, seed=9), 20, "mtp", 2, 0.0)
    hand_edited = {"sampling": {"temperature": "hot", "top_k": 3}}
    assert effective(preferences, hand_edited).sampling == replace(BALANCED, top_k=3)


def test_a_reply_asks_for_the_chosen_sampling_and_shows_prompt_progress(qtbot, services):
    services.settings.n_threads = 1
    services.settings.max_tokens = 2
    # the app's default preset (the fixture pins greedy for other tests), with a fixed seed
    services.settings.sampling = replace(BALANCED, seed=5)
    start_and_load(qtbot, services)
    window = services.window
    sent: list[dict] = []
    generate = services.client.generate
    services.client.generate = lambda **kw: sent.append(kw) or generate(**kw)
    headlines: list[str] = []
    services.client.sig_prefill.connect(lambda _ev: headlines.append(window.stats_panel.headline()))
    in_reply: list[str] = []  # what the reply's own header says meanwhile (after the controller's slot ran)
    services.client.sig_prefill.connect(lambda _ev: in_reply.append(window.transcript.toPlainText()))
    with qtbot.waitSignal(window.chat.sig_reply_finished, timeout=60000):
        window.composer.setPlainText("copper " * 700)  # more than one chunk of 512 tokens
        window.send()
    asked = sent[0]["sampling"]
    assert (asked.temperature, asked.repeat_penalty, asked.repeat_last_n, asked.seed) == (
        BALANCED.temperature, 1.1, BALANCED.repeat_last_n, 5)
    assert headlines[0].startswith("Processing prompt (") and headlines[0].endswith("tokens)…")
    assert any(h.endswith("%") for h in headlines[1:])
    assert "Processing prompt (" in in_reply[0] and any(t.rstrip().endswith("%") for t in in_reply[1:])
    assert "Processing prompt" not in window.transcript.toPlainText()  # gone once the reply came
    services.settings.sampling = BALANCED
    assert window.chat.chat_values().sampling.seed == RANDOM_SEED  # a new seed each reply


def test_the_panel_states_the_measured_speedup_first_and_clears_on_a_model_change(qtbot, services):
    services.settings.model_path = str(synth("glm4moe", "oracle", agree=0.7).path())
    services.settings.n_threads = 1
    services.settings.max_tokens = 24
    services.settings.speculative = "auto"
    start_and_load(qtbot, services)
    window, panel = services.window, services.window.stats_panel
    window.chat.profile_speculative = mtp(3)
    window.chat.profile_speedup = 1.4  # as autotune measured it …
    window.chat.profile_sampling = sampling_key(services.settings.sampling)  # … with this chat's sampling
    send_and_wait(qtbot, window, " the river model")
    assert panel.stats.rounds > 0
    assert panel.headline() == "MTP: 1.4× faster than without (autotuned)"
    panel.grab()  # paints: every MTP term drawn gets its tooltip
    tips = " ".join(text for _rect, text in panel.tips)
    for term in ("speedup", "rollback", "draft depth", "acceptance per position", "mean accepted length", "catch-up",
                 "verify"):
        assert f"<b>{term}</b>" in tips, term
    # Without a measured baseline nothing is claimed.
    window.chat.profile_speculative = None
    services.settings.speculative = "mtp"
    send_and_wait(qtbot, window, " the river")
    assert panel.headline().endswith("tokens per step (speedup not measured)")
    # Another model: the old figures go.
    with qtbot.waitSignal(services.client.sig_loaded, timeout=60000):
        window.models.load()
    assert panel.stats is None and panel.headline() == "" and window.chat.stream.last_stats is None


def test_the_speculation_choice_offers_ngram_and_the_composition(qtbot):
    f = fields(qtbot)
    choices = [f.speculative.itemText(i) for i in range(f.speculative.count())]
    assert {"auto", "mtp", "ngram", "mtp+ngram", "off"} <= set(choices)
    f.speculative.setCurrentText("ngram")
    assert f.values().speculative == "ngram" and f.n_max.isEnabled()



def test_probabilistic_draft_acceptance_is_a_preference_that_reaches_the_request(qtbot, tmp_path, monkeypatch):
    from app.chat.speculative_choice import speculative_for

    f = fields(qtbot)
    assert not f.probabilistic_drafts.isChecked() and "--spec-draft-sampling" in f.probabilistic_drafts.toolTip()
    assert "not seed-identical" in f.probabilistic_drafts.text()
    f.probabilistic_drafts.setChecked(True)
    values = f.values()
    assert values.probabilistic_drafts
    assert speculative_for(values, None, True).draft_sampling == "probabilistic"  # auto without a profile
    assert speculative_for(values, mtp(2), True).label == "mtp n_max=2 probabilistic"  # over autotune's choice
    assert speculative_for(replace(values, speculative="off"), None, True).draft_sampling == "match"
    assert speculative_for(replace(values, probabilistic_drafts=False), None, True).draft_sampling == "match"
    # kept in the preferences, and settings files from before read it as off
    monkeypatch.setattr(Settings, "path", classmethod(lambda cls: tmp_path / "settings.json"))
    settings = Settings()
    settings.set_reply_values(values)
    settings.save()
    assert Settings.load().reply_values().probabilistic_drafts
    (tmp_path / "settings.json").write_text(json.dumps({"n_max": 2}))
    assert not Settings.load().reply_values().probabilistic_drafts

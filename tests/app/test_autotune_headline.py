"""The autotuned speedup in the real chat against the real worker: the profile measured with the chat's
sampling is the one applied, and the panel states its speedup only on replies with that sampling."""

from __future__ import annotations

from dataclasses import replace

from engine.autotune.profiles import ProfileStore, new_profile
from engine.sampling import BALANCED, GREEDY
from engine.speculative.settings import mtp
from tests.app.conftest import send_and_wait, start_and_load
from tests.engine.conftest import synth


def test_the_headline_states_the_autotuned_speedup_only_for_the_sampling_it_was_measured_with(qtbot, services):
    model = str(synth("glm4moe", "oracle", agree=0.7).path())
    services.settings.model_path = model
    services.settings.n_threads = 1
    services.settings.max_tokens = 24
    services.settings.speculative = "auto"
    start_and_load(qtbot, services)
    window, panel = services.window, services.window.stats_panel
    qtbot.waitUntil(lambda: window.models.probe.fingerprint is not None, timeout=60000)
    fingerprint, engine = window.models.probe.fingerprint, services.client.engine.key
    store = ProfileStore()
    store.save(new_profile(fingerprint, model, engine, mtp(2), 1.3, "tuned greedily"))
    store.save(new_profile(fingerprint, model, engine, mtp(3), 1.4, "tuned with Balanced", sampling="balanced"))

    # the chat replies with Balanced: the profile measured with it applies, and its speedup is stated
    services.settings.sampling = replace(BALANCED, seed=5)
    window.models.apply_profile()
    qtbot.waitUntil(lambda: window.chat.profile_speculative == mtp(3), timeout=30000)
    assert window.chat.profile_sampling == "balanced"
    send_and_wait(qtbot, window, " the river model")
    assert panel.headline() == "MTP: 1.4× faster than without (autotuned)"

    # another sampling in this chat: the same setting still drafts, but its figure is not claimed
    services.settings.sampling = replace(GREEDY, repeat_penalty=1.05)
    send_and_wait(qtbot, window, " the river")
    assert panel.stats.settings == mtp(3) and panel.stats.rounds > 0
    line = panel.headline()
    assert "1.4" not in line and line.endswith("tokens per step (autotuned for balanced)"), line
    panel.grab()  # paints it, with the speedup's tooltip
    assert any("<b>speedup</b>" in text for _rect, text in panel.tips)

    # the next lookup with greedy replies takes the greedy profile
    services.settings.sampling = GREEDY
    window.models.apply_profile()
    qtbot.waitUntil(lambda: window.chat.profile_speculative == mtp(2), timeout=30000)
    assert window.chat.profile_sampling == "greedy"
    send_and_wait(qtbot, window, " a model")
    assert panel.headline() == "MTP: 1.3× faster than without (autotuned)"

""""auto" with an adaptive-depth profile, in the real chat against the real
worker: the reply drafts with adaptive depth and the live panel says the
depth the policy chose last."""

from __future__ import annotations

from engine.speculative import stats_text
from engine.speculative.settings import mtp
from tests.app.conftest import reply_with_stats, start_and_load
from tests.engine.conftest import synth


def test_auto_uses_an_adaptive_profile_and_the_panel_shows_the_current_depth(qtbot, services):
    model = synth("glm4moe", "oracle", agree=1.0)
    services.settings.model_path = str(model.path())
    services.settings.speculative = "auto"
    services.settings.max_tokens = 200
    start_and_load(qtbot, services)
    window = services.window
    window.chat.profile_speculative = mtp(4, depth="adaptive")  # what an autotune profile holds
    assert window.chat.speculative_settings().adaptive
    live, finals = reply_with_stats(qtbot, services)
    final = finals[-1]
    assert final.settings == mtp(4, depth="adaptive") and final.rounds > 0
    assert final.draft_depth is not None and 0 <= final.draft_depth <= 4
    line = stats_text.panel_lines(window.stats_panel.stats)[0]
    assert line.startswith(f"draft depth {final.draft_depth} now (adaptive, up to 4)"), line
    assert all(s.draft_depth is not None for s in live if s.rounds)
    window.stats_panel.grab()  # paints with the line

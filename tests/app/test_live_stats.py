"""Live speculative statistics in the chat, against the real worker on a
synthetic MTP model."""

from __future__ import annotations

from engine.speculative import stats_text
from engine.speculative.settings import SpeculativeSettings
from tests.app.conftest import reply_with_stats, send_and_wait, start_and_load
from tests.engine.conftest import synth


def test_live_per_position_acceptance_matches_the_engines_final_counts(qtbot, services):
    model = synth("glm4moe", "oracle", agree=0.7)
    services.settings.model_path = str(model.path())
    services.settings.speculative = "mtp"
    services.settings.n_max = 3
    services.settings.max_tokens = 3000
    start_and_load(qtbot, services)
    window = services.window
    assert window.models.model.mtp == "single"
    live, finals = reply_with_stats(qtbot, services)
    final = finals[-1]
    assert live, "statistics streamed while the reply was generated"
    assert final.rounds > 0 and len(final.acceptance_per_pos) == 3
    # What the panel shows is the engine's final count, exactly.
    shown = window.stats_panel.stats
    assert shown.acceptance_per_pos == final.acceptance_per_pos
    pairs = zip(final.accepted_per_pos, final.drafted_per_pos, strict=True)
    assert [a / d for a, d in pairs] == final.acceptance_per_pos
    assert shown.accepted == final.accepted and shown.drafted == final.drafted
    # Live snapshots only ever grow towards the final counts.
    for snap in live[:-1]:
        assert snap.drafted <= final.drafted and snap.accepted <= final.accepted
        assert all(a <= b for a, b in zip(snap.accepted_per_pos, final.accepted_per_pos, strict=False))
    # The reply's footer carries the final figures; the stored reply keeps them.
    text = window.transcript.toPlainText()
    assert f"MTP {100 * final.acceptance_rate:.0f}% accepted" in text
    assert window.engine_status.speed_label.text() == stats_text.status_line(final)  # the same formatter
    stored = services.store.messages(window.chat.conversation_id)[-1]
    assert stored.stats["accepted_per_pos"] == final.accepted_per_pos  # the store keeps plain JSON


def test_highlighting_marks_text_from_accepted_drafts(qtbot, services):
    model = synth("glm4moe", "oracle", agree=1.0)
    services.settings.model_path = str(model.path())
    services.settings.speculative = "mtp"
    services.settings.max_tokens = 40
    start_and_load(qtbot, services)
    window = services.window
    send_and_wait(qtbot, window, " the river")
    reply = window.transcript.messages[-1]
    drafted_text = "".join(t for t, d in reply.segments if d)
    assert drafted_text and len(drafted_text) > len(reply.content) / 2  # most tokens came from drafts
    assert window.palette_.draft_bg not in window.transcript.toHtml().lower()
    window.highlight_box.setChecked(True)
    assert window.palette_.draft_bg in window.transcript.toHtml().lower()


def test_the_panel_shows_which_source_proposed_the_accepted_tokens(qtbot, services):
    # MTP + n-gram on an oracle model: the reply loops, so both sources draft
    model = synth("glm4moe", "oracle", agree=0.7)
    services.settings.model_path = str(model.path())
    services.settings.speculative = "mtp+ngram"
    services.settings.n_max = 6
    services.settings.max_tokens = 400
    start_and_load(qtbot, services)
    window = services.window
    asked = window.chat.speculative_settings()
    assert (asked.mode, asked.n_max) == ("mtp+ngram", 6)
    _live, finals = reply_with_stats(qtbot, services)
    final = finals[-1]
    assert final.settings == SpeculativeSettings("mtp+ngram", 6) and final.rounds > 0
    assert set(final.drafted_by_source) == {"mtp", "ngram"}, final.drafted_by_source
    assert sum(final.accepted_by_source.values()) == final.accepted
    assert sum(final.drafted_by_source.values()) == final.drafted
    panel = window.stats_panel
    assert panel.stats == final
    lines = stats_text.panel_lines(panel.stats)
    for source, name in (("mtp", "MTP"), ("ngram", "n-gram")):
        accepted, drafted = final.accepted_by_source.get(source, 0), final.drafted_by_source[source]
        assert f"{name} drafts: {accepted}/{drafted} accepted" in lines
    panel.grab()  # paint: the panel notes each explained term it drew
    assert any(tip.startswith("<b>draft source</b>") for _rect, tip in panel.tips)

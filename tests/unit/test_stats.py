import pytest

from engine.speculative import stats_text
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp
from engine.speculative.stats import GenerationStats
from engine.worker.events import stats_from_json


def test_acceptance_figures_follow_their_definitions():
    s = GenerationStats()
    s.record_round(3, 3)
    s.record_round(3, 1)
    s.record_round(2, 0)
    s.record_round(0, 0)  # an empty draft is a plain step, not a round
    assert (s.rounds, s.plain_steps, s.drafted, s.accepted) == (3, 1, 8, 4)
    assert s.acceptance_rate == 0.5
    assert s.mean_accepted_length == 1 + 4 / 3
    assert s.drafted_per_pos == [3, 3, 2]
    assert s.accepted_per_pos == [2, 1, 1]
    assert s.acceptance_per_pos == [2 / 3, 1 / 3, 0.5]
    assert s.accepted_histogram == {3: 1, 1: 1, 0: 1}


def test_no_rounds_means_no_acceptance_figures():
    s = GenerationStats()
    assert s.acceptance_rate is None and s.mean_accepted_length is None
    assert s.to_dict()["acceptance_per_pos"] == []


def test_one_formatter_words_the_figures_the_same_everywhere():
    s = GenerationStats(settings=mtp(3), rollback="kv", generated_tokens=24, prompt_tokens=6)
    s.record_round(3, 3)
    s.record_round(3, 1)
    s.t_first_token, s.t_end = s.t_start + 0.5, s.t_start + 1.5
    snap = s.snapshot()
    assert snap.to_dict() == s.to_dict()
    assert stats_text.status_line(snap) == "23.0 tok/s · MTP 67% accepted"
    assert stats_text.footer(snap, "complete") == "24 tokens · 23.0 tok/s · MTP 67% accepted · mean length 3.00 · 1.5 s"
    assert stats_text.footer(snap, "cancelled").startswith("stopped · 24 tokens")
    assert stats_text.footer(None, "interrupted") == "interrupted: the engine stopped before the reply ended"
    assert "acceptance 66.7%  (4/6)" in stats_text.panel_lines(snap)
    report = stats_text.report(snap, "length")
    assert report.startswith("[length] 6 prompt tokens") and "[mtp] mtp n_max=3, rollback kv: 2 rounds" in report


def test_plain_decoding_reads_as_off():
    snap = GenerationStats().snapshot()
    assert snap.settings == SPECULATION_OFF and not snap.speculative
    assert stats_text.panel_lines(snap) == ["off for this reply"] and stats_text.phase_label(snap, "verify") == "decode"
    assert stats_text.status_line(snap) == "" and "[mtp]" not in stats_text.report(snap, "stop")


@pytest.mark.parametrize("stored, settings", [
    ("none", SPECULATION_OFF),  # before "off" had one name
    ("off", SPECULATION_OFF),
    ("mtp(n_max=3)", mtp(3)),
    ("mtp(adaptive, n_max=8)", mtp(8, depth="adaptive")),
    ("mtp+ngram(n_max=6)", SpeculativeSettings("mtp+ngram", 6)),
    ("ngram(adaptive, n_max=8)", SpeculativeSettings("ngram", 8, depth="adaptive")),
])
def test_statistics_stored_with_a_mode_label_still_read(stored, settings):
    # replies stored before the statistics carried their settings (protocol 4 and older)
    snap = stats_from_json({"mode": stored, "rounds": 2, "drafted": 4, "accepted": 3})
    assert snap is not None and snap.settings == settings and snap.rounds == 2
    assert snap.speculative == settings.enabled


def test_tokens_per_step_counts_plain_steps_too():
    s = GenerationStats(settings=mtp(3), generated_tokens=15)
    for _ in range(10):
        s.record_round(0, 0)  # ten plain steps: declined drafts, adaptive depth at 0
    s.record_round(3, 3)  # one fully accepted round of 3
    snap = s.snapshot()
    assert snap.mean_accepted_length == 4.0  # per round, as its name says
    assert snap.tokens_per_step == 14 / 11  # what each target decode produced
    assert "1.27 tokens per step" in stats_text.headline(snap)
    assert GenerationStats().snapshot().tokens_per_step is None

from engine.speculative.stats import GenerationStats


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

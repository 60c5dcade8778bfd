"""n-gram drafting logic without a model: prompt lookup, the persistent map,
the drafter's context bookkeeping, the composition policy's gate, and
per-source statistics."""

from __future__ import annotations

import numpy as np
import pytest

from engine.speculative.ngram import NgramDrafter, NgramMap, Yield, prompt_lookup
from engine.speculative.settings import MTP_NGRAM, NGRAM, SpeculativeSettings, ngram
from engine.speculative.stats import GenerationStats


def lookup(ctx: list[int], id_last: int, k: int = 4, lo: int = 2, hi: int = 6) -> tuple[list[int], int]:
    return prompt_lookup(np.array(ctx, dtype=np.int32), len(ctx), id_last, lo, hi, k)


def test_prompt_lookup_proposes_what_followed_the_longest_match():
    #        0  1  2  3  4  5  6  7  8  9 10 11   tail: 1 2 3 (id_last 3)
    ctx = [9, 2, 3, 7, 7, 1, 2, 3, 4, 5, 0, 1, 2]
    draft, match = lookup(ctx, 3)
    assert (draft, match) == ([4, 5, 0, 1], 3)  # "1 2 3" at 5..7 beats the later-free "2 3" at 1..2


def test_prompt_lookup_prefers_the_most_recent_of_equal_matches():
    ctx = [5, 6, 1, 5, 6, 2, 8, 5]
    assert lookup(ctx, 6, k=2) == ([2, 8], 2)


def test_prompt_lookup_needs_ngram_min_tokens_of_match():
    ctx = [4, 1, 9, 7, 3]
    assert lookup(ctx, 1, lo=2) == ([], 0)  # only "1" matches
    assert lookup(ctx, 1, lo=1) == ([9, 7, 3, 1], 1)


def test_prompt_lookup_continues_a_loop_past_the_end_of_the_context():
    ctx = [8, 1, 2, 3, 1, 2]  # id_last 3: the loop "1 2 3" continues
    assert lookup(ctx, 3, k=7) == ([1, 2, 3, 1, 2, 3, 1], 3)


def test_prompt_lookup_caps_the_match_at_ngram_max():
    ctx = [1, 2, 3, 4, 5, 9, 1, 2, 3, 4]
    assert lookup(ctx, 5, k=1, hi=3) == ([9], 3)


def test_the_map_finds_the_longest_ngram_and_stops_at_a_break():
    m = NgramMap(2, 4)
    m.extend([1, 2, 3, 4, 5])
    m.break_segment()
    m.extend([7, 3, 4, 6])
    assert m.lookup([2, 3, 4], 5) == ([5], 3)  # the longest key wins; the break ends the draft
    assert m.lookup([9, 3, 4], 5) == ([6], 2)  # "3 4" last seen in the second segment
    assert m.lookup([5, 7], 3) == ([], 0)  # no key spans a break


def test_the_map_stays_within_its_capacity_and_keeps_the_recent_half():
    m = NgramMap(2, 3, capacity=1000)
    rng = np.random.default_rng(0)
    for _ in range(30):
        m.extend(rng.integers(0, 50, 100))
    assert len(m) <= 1000
    m.extend([101, 102, 103])
    assert m.lookup([101, 102], 1) == ([103], 2)


def feed(drafter: NgramDrafter, prompt: list[int], reply: list[int]) -> list[list[int]]:
    """Run the drafter the way the generator does, every draft accepted as far as it matches ``reply``."""
    drafter.process(prompt[:-1], 0)
    pos, id_last, drafts = len(prompt) - 1, prompt[-1], []
    out = list(reply)
    while out:
        d = drafter.draft(id_last, pos, 8)
        drafts.append(d)
        n = 0
        while n < len(d) and n + 1 < len(out) and d[n] == out[n]:
            n += 1
        drafter.verified([id_last, *d], pos)
        drafter.accept(n, pos)
        pos += n + 1
        id_last = out[n]
        out = out[n + 1:]
    return drafts


def test_the_drafter_copies_a_reply_it_saw_before_from_the_map():
    drafter = NgramDrafter()
    prompt, reply = [1, 2, 3, 4], [10, 11, 12, 13, 14, 15, 16, 17, 18]
    drafter.begin(ngram(8))
    first = feed(drafter, prompt, reply)
    assert not any(first)  # nothing to copy yet
    drafter.begin(ngram(8))  # regenerate: the prompt is the same, the old reply is in the map only
    second = feed(drafter, prompt, reply)
    assert second[0] == reply[:8] and drafter.last_match >= 2


def test_the_map_is_forgotten_when_another_conversation_starts():
    drafter = NgramDrafter()
    drafter.begin(ngram(8))
    feed(drafter, [1, 2, 3, 4], [10, 11, 12, 13, 14])
    drafter.begin(ngram(8))
    feed(drafter, [50, 51, 52, 4], [60])  # does not continue the previous context
    assert drafter.map.lookup([4, 10], 3) == ([], 0)


def test_settings_take_the_ngram_modes_and_check_their_bounds():
    assert SpeculativeSettings(NGRAM, 8).uses_ngram and not SpeculativeSettings(NGRAM, 8).uses_mtp
    both = SpeculativeSettings(MTP_NGRAM, 8)
    assert both.uses_mtp and both.uses_ngram and both.enabled
    assert both.limited_to(0).mode == NGRAM and both.limited_to(2) == both
    assert SpeculativeSettings.from_json(both.to_json()) == both
    with pytest.raises(ValueError, match="ngram_min"):
        SpeculativeSettings(NGRAM, 4, ngram_min=5, ngram_max=3)


def test_per_source_counts_add_up_to_the_totals():
    stats = GenerationStats()
    for drafted, accepted, source in ((3, 2, "mtp"), (8, 8, "ngram"), (0, 0, "ngram"), (5, 0, "ngram")):
        stats.record_round(drafted, accepted, source)
    snap = stats.snapshot()
    assert snap.drafted_by_source == {"mtp": 3, "ngram": 13}
    assert snap.accepted_by_source == {"mtp": 2, "ngram": 8}
    assert sum(snap.drafted_by_source.values()) == snap.drafted
    assert sum(snap.accepted_by_source.values()) == snap.accepted
    assert sum(snap.rounds_by_source.values()) == snap.rounds == 3


def test_the_gate_holds_short_matches_back_after_misses_but_sends_long_ones():
    drafter = NgramDrafter()
    drafter.begin(ngram(4))
    drafter.yield_.value = 0.0  # recent drafts were refused
    drafter.process([5, 1, 2, 3, 4, 9, 9, 1], 0)
    assert drafter.draft(2, 8, 8) == [] and drafter.last_match == 2  # "1 2": short, held back
    drafter.begin(ngram(4))
    drafter.yield_.value = 0.0
    drafter.process([6, 8, 1, 2, 3, 4, 9, 6, 8, 1], 0)
    assert drafter.draft(2, 10, 8) == [3, 4, 9, 6] and drafter.last_match == 4  # "6 8 1 2": long, sent


def test_a_held_draft_is_scored_as_the_targets_tokens_arrive():
    y = Yield(0.0)
    y.hold([3, 4, 5], 10)
    ctx = np.array([0] * 10 + [2], dtype=np.int32)  # position 10 held id_last 2
    y.score_held(ctx, 11, 3)  # produced so far: 3 — as drafted: wait for more
    assert y.value == 0.0
    ctx = np.append(ctx, 3)
    y.score_held(ctx, 12, 7)  # produced: 3 7 — one hit
    assert y.value == pytest.approx(0.2)


def test_the_chat_command_asks_for_ngram_and_the_composition():
    from engine.cli import build_parser, spec_mode

    parse = build_parser().parse_args
    assert spec_mode(parse(["chat", "hi", "--ngram"])) == NGRAM
    assert spec_mode(parse(["chat", "hi", "--mtp", "--ngram"])) == MTP_NGRAM
    assert spec_mode(parse(["chat", "hi", "--mtp"])) == "mtp" and spec_mode(parse(["chat", "hi"])) == "off"


def test_each_turn_feeds_the_map_only_what_is_new():
    drafter = NgramDrafter()
    prompt, reply = [1, 2, 3, 4], [10, 11, 12, 13, 14, 15]
    drafter.begin(ngram(8))
    feed(drafter, prompt, reply)
    context = prompt + reply
    for turn in range(3):  # each turn's prompt is the conversation so far plus a new message
        drafter.begin(ngram(8))
        before = len(drafter.map)
        message, answer = [20 + turn, 30 + turn, 40 + turn], [50 + turn, 60 + turn, 70 + turn]
        feed(drafter, context + message, answer)
        drafter.begin(ngram(8))  # the tail of the reply reaches the map at the next generation
        context = context + message + answer
        assert len(drafter.map) - before == len(message) + len(answer), (turn, drafter.map.history)
    # n-grams across the turns are there: what followed [13, 14, 15, 20] in the first turn's context
    assert drafter.map.lookup([14, 15, 20], 2) == ([30, 40], 3)


def test_a_regenerated_reply_feeds_the_map_from_where_it_parts():
    drafter = NgramDrafter()
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    drafter.begin(ngram(8))
    feed(drafter, prompt, [10, 11, 12, 13, 14])
    drafter.begin(ngram(8))
    before = len(drafter.map)
    second = feed(drafter, prompt, [10, 11, 90, 91, 92])  # regenerated: parts from the old reply at 90
    drafter.begin(ngram(8))
    assert second[0][:2] == [10, 11]  # the old reply is still drafted from the map
    # a break, the last ngram_max - 1 prompt tokens again (n-grams across the parting), then the new reply
    assert len(drafter.map) - before == 1 + (ngram(8).ngram_max - 1) + 5, drafter.map.history


def test_another_conversation_feeds_its_whole_context_to_the_fresh_map():
    drafter = NgramDrafter()
    drafter.begin(ngram(8))
    first = list(range(100, 130))
    feed(drafter, first, [20, 21, 22])
    drafter.begin(ngram(8))
    # shares its first 8 of 30 tokens only: another conversation, so the map starts over with all of it
    feed(drafter, first[:8] + list(range(200, 222)), [60])
    assert drafter.map.history[:8] == first[:8], drafter.map.history
    assert drafter.map.lookup(first[:2], 1) == ([first[2]], 2)

"""DrafterChoice without an MTP head (engine/speculative/choice.py): what each mode drafts with, which
policy it gets, and what is kept between requests. With a head: tests/engine/test_drafter_choice.py."""

from __future__ import annotations

from dataclasses import replace

from engine.speculative.adaptive import AdaptiveDepth
from engine.speculative.choice import DrafterChoice
from engine.speculative.depth import PLAIN, FixedDepth
from engine.speculative.drafter import PlainDrafter
from engine.speculative.ngram import NgramDrafter
from engine.speculative.settings import ADAPTIVE, MAX_DRAFT, NGRAM, SPECULATION_OFF, mtp, ngram


def test_off_and_mtp_without_a_head_decode_plainly_with_the_choices_own_plain_drafter():
    choice = DrafterChoice()
    for asked in (SPECULATION_OFF, mtp(3), mtp(3, depth=ADAPTIVE)):
        spec, drafter, policy = choice.choose(asked, None, target_threads=4)
        assert spec == SPECULATION_OFF and policy is PLAIN
        assert drafter is choice.plain and isinstance(drafter, PlainDrafter)
    assert choice.ngram is None and not choice.policies  # nothing made for plain decoding
    assert DrafterChoice().plain is not choice.plain  # a request's guide and margins sit on it: one a sequence


def test_ngram_keeps_its_drafter_between_requests_under_a_fresh_fixed_depth():
    choice = DrafterChoice()
    spec, first, policy = choice.choose(ngram(5), None, target_threads=4)
    assert spec == ngram(5) and isinstance(first, NgramDrafter)
    assert isinstance(policy, FixedDepth) and policy.n_max == MAX_DRAFT  # the drafter stops at n_max
    _, again, policy_again = choice.choose(ngram(2), None, target_threads=4)
    assert again is first  # the map is the sequence's text: it carries over
    assert policy_again is not policy  # a fixed depth keeps nothing between replies


def test_mtp_and_ngram_without_a_head_is_ngram_alone():
    choice = DrafterChoice()
    spec, drafter, _ = choice.choose(ngram(4, mtp_too=True), None, target_threads=4)
    assert spec.mode == NGRAM and spec.n_max == 4
    assert drafter is choice.ngram and choice.composed is None


def test_adaptive_depth_is_kept_per_mode_depth_and_threads():
    choice = DrafterChoice()
    asked = replace(ngram(6), depth=ADAPTIVE)
    _, _, policy = choice.choose(asked, None, target_threads=4)
    assert isinstance(policy, AdaptiveDepth) and policy.n_max == 6
    assert choice.choose(asked, None, target_threads=4)[2] is policy  # what it measured carries over
    assert choice.choose(replace(asked, n_max=3), None, target_threads=4)[2] is not policy
    assert choice.choose(asked, None, target_threads=2)[2] is not policy  # other threads, other costs
    assert choice.choose(asked, None, target_threads=4)[2] is policy
    assert DrafterChoice().choose(asked, None, target_threads=4)[2] is not policy  # another sequence's own


def test_close_drops_the_ngram_drafter_and_the_next_request_makes_a_new_one():
    choice = DrafterChoice()
    _, first, _ = choice.choose(ngram(5), None, target_threads=4)
    choice.close()
    assert choice.ngram is None and choice.composed is None
    assert choice.choose(ngram(5), None, target_threads=4)[1] is not first

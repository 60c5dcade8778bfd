"""A request's drafter and depth policy with a real MTP head, chosen by one type for a single session and
for each sequence of a multi-sequence one (engine/speculative/choice.py DrafterChoice)."""

from __future__ import annotations

from engine.generation.sequences import Sequences
from engine.speculative.adaptive import AdaptiveDepth
from engine.speculative.adaptive.gated import GatedDepth
from engine.speculative.compose import ComposeDrafter
from engine.speculative.settings import ADAPTIVE, MTP, mtp, ngram
from tests.engine.conftest import heads_for, open_session, synth

ARCH = "mimo2"  # chained heads: the model drafts at most its head count


def test_the_session_and_each_sequence_choose_alike_each_with_its_own_lane_and_policies():
    deepest = heads_for(ARCH)
    assert deepest < 8
    with open_session(synth(ARCH, "random"), parallel=2) as session:
        sequences = Sequences(session)
        asked = mtp(8, depth=ADAPTIVE)
        spec, drafter, policy = session.speculation(asked)
        assert (spec.mode, spec.n_max) == (MTP, deepest)  # the model's limit applies
        assert drafter is session.mtp_drafter and isinstance(policy, GatedDepth)  # alone: behind the gate
        assert isinstance(policy.policy, AdaptiveDepth) and policy.policy.n_max == deepest
        assert session.speculation(asked)[2] is policy  # kept between replies, with its gate

        for seq in (0, 1):
            s_spec, s_drafter, s_policy = sequences.speculation(asked, seq)
            assert s_spec == spec and s_drafter is session.mtp_lane(seq)
            # a sequence's own, chosen for with the others' by the batch (whose gate is the engine's)
            assert isinstance(s_policy, AdaptiveDepth) and s_policy is not policy.policy
            assert sequences.speculation(asked, seq)[2] is s_policy
        assert sequences.speculation(asked, 1)[1] is not session.mtp_drafter

        composed = sequences.speculation(ngram(8, mtp_too=True), 1)[1]
        assert isinstance(composed, ComposeDrafter)
        assert composed.mtp is session.mtp_lane(1) and composed.deepest == deepest
        assert composed.ngram is sequences.memory[1].drafters.ngram is not session.ngram_drafter
        single = session.speculation(ngram(8, mtp_too=True))[1]
        assert isinstance(single, ComposeDrafter) and single.mtp is session.mtp_drafter and single is not composed

        session.set_threads(session.options.n_threads, session.options.n_threads + 1)  # other draft threads
        assert session.speculation(asked)[2] is not policy
        assert sequences.speculation(asked, 1)[2] is not s_policy

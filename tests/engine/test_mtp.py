"""MTP speculative decoding on synthetic models of every architecture.

The contract: greedy output with speculation is token-identical to plain
greedy output; on oracle models every round accepts exactly what the
simulator predicts; mismatched sidecars are refused before llama.cpp sees them.
"""

from __future__ import annotations

from functools import partial

import pytest

from engine.errors import ContextError, SidecarMismatch
from engine.generation.session import LoadOptions, Session
from engine.runtime import SamplingParams
from engine.speculative import rollback
from engine.speculative.settings import mtp
from engine.synth import HeadMap, SynthModel, SynthSpec, simulate
from tests.engine import conftest
from tests.engine.conftest import ARCHS, heads_for, open_session, synth

PROMPT = " the river model"
N_TOKENS = 48
run = partial(conftest.run, prompt=PROMPT, max_tokens=N_TOKENS)  # MTP to a depth, or plain with None


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weights", ["oracle", "mixed", "random"])
@pytest.mark.parametrize("layout", ["combined", "sidecar"])
def test_greedy_output_with_mtp_is_identical_to_plain(arch, weights, seed, layout):
    model = synth(arch, weights, agree=0.7, seed=seed)
    session = open_session(model, layout)
    try:
        assert session.mtp_drafter is not None
        plain = run(session, None).tokens
        for n_max in (1, 2, 3, 4):
            result = run(session, n_max)
            assert result.tokens == plain, f"n_max={n_max}"
            assert result.stats.rounds > 0
    finally:
        session.close()


ORACLE_CASES = [(arch, agree, reads) for arch in ARCHS for agree, reads in
                [(1.0, "token"), (0.6, "token"), (1.0, "hidden")]
                # chained heads after the first read the previous head's state, not the trunk's
                if not (reads == "hidden" and arch == "step35")]


@pytest.mark.parametrize("arch, agree, reads", ORACLE_CASES)
def test_oracle_acceptance_equals_the_simulator_round_by_round(arch, agree, reads):
    model = synth(arch, "oracle", agree=agree, reads=reads)
    session = open_session(model)
    try:
        prompt = session.model.tokenize(PROMPT)
        for n_max in (1, 2, 3, 4):
            result = run(session, n_max)
            tokens, rounds = simulate(model.maps, prompt[-1], prompt[-2], N_TOKENS, n_max,
                                      chained=heads_for(arch) > 1)
            assert result.tokens == tokens
            assert result.accepted_per_round == rounds, f"n_max={n_max}"
            assert result.stats.accepted == sum(rounds)
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
def test_oracle_acceptance_is_exact_at_a_real_vocabulary(arch):
    # 151,936 tokens: the maps take part over the first 4,094 (engine.synth.tokenizer.MAX_ACTIVE),
    # the LM heads keep every row, so drafts and the p_min gate see a real vocabulary's logits.
    reads = "token" if arch == "step35" else "hidden"
    model = SynthModel(SynthSpec(arch=arch, size="tiny-152k", n_heads=heads_for(arch),
                                 heads=(HeadMap(reads, 0.7, 3),)))
    assert model.maps is not None and len(model.maps.f) == 4094
    session = open_session(model)
    try:
        assert session.model.n_vocab == 151_936
        prompt = session.model.tokenize(PROMPT)
        for n_max in (1, 3):
            result = run(session, n_max)
            tokens, rounds = simulate(model.maps, prompt[-1], prompt[-2], N_TOKENS, n_max,
                                      chained=heads_for(arch) > 1)
            assert result.tokens == tokens
            assert result.accepted_per_round == rounds, f"n_max={n_max}"
            assert 0 < sum(rounds) < result.stats.drafted
    finally:
        session.close()


def test_full_acceptance_drafts_n_max_every_round_and_counts_exactly():
    session = open_session(synth("glm4moe", "oracle", agree=1.0))
    try:
        s = run(session, 3).stats
        assert s.acceptance_rate == 1.0
        # 1 token from the prompt, then rounds of 3 drafts + 1 bonus token; the last
        # round drafts only what still fits under max_tokens.
        assert s.rounds == -(-(N_TOKENS - 1) // 4)
        assert s.drafted == s.accepted == N_TOKENS - 1 - s.rounds
        assert s.drafted_per_pos[0] == s.rounds and s.accepted_per_pos == s.drafted_per_pos
        assert s.mean_accepted_length == pytest.approx(1 + s.accepted / s.rounds)
        assert s.generated_tokens == N_TOKENS
    finally:
        session.close()


def test_chained_heads_cap_the_draft_at_the_head_count():
    session = open_session(synth("step35", "oracle", agree=1.0))
    try:
        s = run(session, 6).stats
        assert len(s.drafted_per_pos) == 3 and s.settings == mtp(3)  # what ran: the six asked for, limited
    finally:
        session.close()


def test_p_min_gates_low_confidence_drafts():
    session = open_session(synth("glm4moe", "mixed", seed=1))
    try:
        ungated = run(session, 3).stats
        gated = run(session, 3, p_min=1.01).stats  # nothing is that sure: no drafts at all
        assert ungated.drafted > 0 and gated.drafted == 0 and gated.plain_steps > 0
    finally:
        session.close()


def test_sampling_with_mtp_keeps_the_seeded_target_distribution_per_token():
    # With a seeded sampler, each emitted token is sampled from the target at
    # its position; on an oracle model at full acceptance the text must match
    # plain seeded sampling whenever the target is (near) deterministic.
    session = open_session(synth("glm4moe", "oracle", agree=1.0))
    try:
        sampling = SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, seed=42)
        plain = run(session, None, sampling=sampling).tokens
        spec = run(session, 3, sampling=sampling).tokens
        assert plain == spec
    finally:
        session.close()


def test_wrong_rollback_is_detected_on_a_hybrid_model(monkeypatch):
    # Prove the identity test can fail: skip the target rollback and the
    # recurrent state goes wrong (or llama.cpp refuses the next position).
    model = synth("qwen35", "mixed", seed=1)
    session = open_session(model)
    try:
        plain = run(session, None).tokens
        monkeypatch.setattr(rollback.TargetRollback, "after_verify", lambda *a, **k: None)
        try:
            broken = run(session, 3).tokens
        except ContextError:
            return
        assert broken != plain
    finally:
        session.close()


def test_rollback_path_is_chosen_per_architecture():
    # qwen3next keeps snapshots in the patched engine (packaging/patches/0004-qwen3next-rs-rollback)
    expect = {"glm4moe": "kv", "step35": "kv", "qwen35": "rs_seq", "qwen3next": "rs_seq"}
    for arch, strategy in expect.items():
        session = open_session(synth(arch))
        try:
            assert session.rollback_strategy == strategy
            assert session.describe()["rollback"] == strategy
        finally:
            session.close()


@pytest.mark.parametrize("layout, fragment", [
    ("sidecar-relative", "relative instead of absolute"),
    ("sidecar-duplicates", "legacy exporter"),
    ("sidecar-missing", "missing tensor blk.4.nextn.hnorm.weight"),
    ("sidecar-other-embd", "hidden size (n_embd_out) 128; this target has hidden size (n_embd_out) 64"),
    ("sidecar-other-vocab", "a vocabulary of 640; this target has a vocabulary of 512"),
    ("sidecar-other-layers", "trunk layers 6; this target has trunk layers 4"),
])
def test_mismatched_sidecars_are_refused_before_any_native_load(layout, fragment):
    model = synth("glm4moe")
    with pytest.raises(SidecarMismatch, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Session(LoadOptions(path=str(model.path("trunk")), sidecar=str(model.path(layout)), n_ctx=256))


def test_mtp_requested_on_a_model_without_mtp_decodes_plainly_with_a_reason(default_model):
    session = Session(LoadOptions(path=str(default_model), n_ctx=256))
    try:
        assert session.mtp_drafter is None
        assert "no MTP/NextN layers" in session.mtp_unavailable_reason
        result = run(session, 3, prompt="The capital of France is")
        assert result.stats.rounds == 0 and not result.stats.settings.enabled and result.tokens
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["qwen3next"])
def test_folded_catch_up_changes_no_token_and_no_acceptance(arch):
    model = synth(arch, "mixed", seed=2)
    folded = open_session(model)
    plain_loop = Session(LoadOptions(path=str(model.path()), n_ctx=512, fold=False))
    try:
        assert folded.mtp_drafter.fold and not plain_loop.mtp_drafter.fold
        for n_max in (1, 3):
            a, b = run(folded, n_max), run(plain_loop, n_max)
            assert a.tokens == b.tokens
            assert a.accepted_per_round == b.accepted_per_round and a.drafted_per_round == b.drafted_per_round
    finally:
        folded.close()
        plain_loop.close()


def test_folding_is_on_only_where_the_mtp_graph_crops_to_the_output_rows():
    # The patched engine's glm4moe and qwen35 graphs crop to the output rows
    # before exporting the MTP hidden state (packaging/patches/0001), as
    # qwen3next's always did; the probe must find that on the real graph, and
    # step35 folds nothing because it chains heads.
    expect = {"glm4moe": (True, True), "qwen35": (True, True), "qwen3next": (True, True),
              "step35": (True, False)}
    for arch, (crops, fold) in expect.items():
        for weights in ("oracle", "random"):
            session = open_session(synth(arch, weights))
            try:
                assert (session.mtp_drafter.crops_rows, session.mtp_drafter.fold) == (crops, fold), (arch, weights)
            finally:
                session.close()

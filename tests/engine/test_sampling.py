"""Sampling beyond greedy: penalties, seeds, presets, and prefill progress.

The sampler chain is stateful (the penalties remember what it accepted), so
speculation keeps the target's distribution only if the chain sees exactly
the emitted tokens, in order, after the prompt. Seeded sampling with
penalties and MTP must therefore equal seeded plain sampling (up to a draw
that numeric noise moves across a boundary: tests/engine/seeded.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import partial

import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.sampling import BALANCED, DEFAULT_PRESET, PRECISE, PRESETS, SamplingParams
from engine.speculative.settings import mtp
from engine.worker import protocol as P
from tests.engine import conftest
from tests.engine.conftest import open_session, synth
from tests.engine.seeded import assert_same_sampling, record_sampled_rows

PROMPT = " the river model"
run = partial(conftest.run, prompt=PROMPT, max_tokens=48)  # plain unless asked, sampled as asked
PENALISED = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=7, repeat_penalty=1.3,
                           repeat_last_n=32, presence_penalty=0.4, frequency_penalty=0.3)


@pytest.mark.parametrize("arch, weights, seed", [("glm4moe", "mixed", 1), ("qwen35", "mixed", 1),
                                                 ("step35", "mixed", 1)])
def test_seeded_sampling_with_penalties_and_mtp_equals_seeded_plain_sampling(arch, weights, seed, monkeypatch):
    # equal up to a parting, and a parting only where the sampled rows' logits differ (tests/engine/seeded.py)
    session = open_session(synth(arch, weights, seed=seed), n_threads=1)
    rows = record_sampled_rows(session, monkeypatch)
    try:
        session.prefix.forget()
        plain = run(session, sampling=PENALISED)
        plain_rows = list(rows)
        unpenalised = run(session, sampling=SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=7))
        assert unpenalised.tokens != plain.tokens  # the penalties do change this reply: the test is not vacuous
        for n_max in (1, 3):
            session.prefix.forget()  # both runs prefill the same way: only verify rows differ from plain's
            rows.clear()
            spec = run(session, mtp(n_max), sampling=PENALISED)
            assert_same_sampling(plain.tokens, plain_rows, spec.tokens, rows, f"n_max={n_max}")
            # rejections happened, so rows past a rejected draft were verified but never sampled
            assert spec.stats.rounds > 0 and 0 < spec.stats.accepted < spec.stats.drafted, n_max
    finally:
        session.close()


def test_greedy_with_a_repeat_penalty_and_mtp_is_plain_greedy_with_it():
    session = open_session(synth("glm4moe", "mixed", seed=1), n_threads=1)
    try:
        plain = run(session, sampling=PRECISE)
        assert plain.tokens != run(session, sampling=SamplingParams()).tokens
        assert run(session, mtp(3), sampling=PRECISE).tokens == plain.tokens
    finally:
        session.close()


def repeats(tokens: list[int], window: int = 12, times: int = 3) -> bool:
    """Does some run of ``window`` tokens occur ``times`` times or more (a paragraph looping)?"""
    counts = Counter(tuple(tokens[i:i + window]) for i in range(len(tokens) - window + 1))
    return max(counts.values(), default=0) >= times


@pytest.fixture(scope="module")
def built_in(default_model):
    session = Session(LoadOptions(path=str(default_model), n_ctx=1024, n_threads=1))
    yield session
    session.close()


def test_the_default_preset_does_not_loop_on_the_built_in_model(built_in):
    # The old default (greedy, no penalty) repeated one paragraph word for word
    # to the token limit on this question.
    assert PRESETS[DEFAULT_PRESET] == BALANCED
    ask = ({"role": "user", "content": "What are three uses of copper?"},)

    def reply(sampling: SamplingParams) -> list[int]:
        return generate(built_in, GenerateRequest(messages=ask, sampling=sampling, max_tokens=200)).tokens

    assert repeats(reply(SamplingParams()))  # the detector sees the old loop
    assert not repeats(reply(PRECISE))
    for seed in (1, 2):
        assert not repeats(reply(replace(BALANCED, seed=seed))), seed


def test_the_prompt_is_in_the_penalties_history(built_in):
    # As llama.cpp's server and CLI: the last repeat_last_n tokens of the prompt
    # count, so a strong penalty keeps the reply from simply repeating the
    # prompt's words, from its first token on.
    prompt = "The cat sat on the mat. The cat sat on the mat. The cat sat on the"
    prompt_tokens = set(built_in.model.tokenize(prompt, add_special=True, parse_special=True))
    free = run(built_in, sampling=SamplingParams(), max_tokens=1, prompt=prompt)
    assert free.tokens[0] in prompt_tokens  # " mat"
    strong = SamplingParams(presence_penalty=2.0, repeat_penalty=10.0)
    assert run(built_in, sampling=strong, max_tokens=1, prompt=prompt).tokens[0] not in prompt_tokens
    # without a history (repeat_last_n 0) the penalties are off
    off = SamplingParams(presence_penalty=2.0, repeat_penalty=10.0, repeat_last_n=0)
    assert run(built_in, sampling=off, max_tokens=1, prompt=prompt).tokens == free.tokens


def test_prefill_progress_events_arrive_for_a_long_prompt(worker):
    model = synth("glm4moe", "mixed", seed=1)
    loaded = worker.call(P.LoadRequest(id="l", options=P.LoadOptions(path=str(model.path()), n_ctx=2048, n_threads=1)))
    assert isinstance(loaded[-1], P.LoadedEvent)
    events = worker.call(P.GenerateRequestMsg(id="g", prompt=PROMPT * 100, max_tokens=2))
    prefill = [ev for ev in events if isinstance(ev, P.PrefillEvent)]
    total = prefill[0].total
    assert total > 1024  # several chunks of n_batch (512)
    assert [ev.done for ev in prefill] == [0, 512, 1024, *([1536] if total > 1536 else []), total]
    assert all(ev.total == total for ev in prefill)
    first_token = next(i for i, ev in enumerate(events) if isinstance(ev, P.TokenEvent | P.DoneEvent))
    assert events.index(prefill[-1]) < first_token

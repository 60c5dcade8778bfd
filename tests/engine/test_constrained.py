"""Constrained and inspected sampling with speculation: grammars, JSON schemas,
logit bias and logprobs on the real engine.

A grammar is a stage of the sampler chain and advances only over emitted
tokens, so speculation needs no grammar rollback: a draft the grammar forbids
is rejected like any other wrong draft. What must hold, and is checked on
heads that read the hidden state (random weights, so a wrong state would
change the drafts): greedy output under a grammar is token-identical with
MTP on and off, the drafts still get verified (rounds happen, some drafts are
rejected by the grammar), and the output is in the grammar's language.
"""

from __future__ import annotations

import json
import math
import re
from functools import partial

import pytest

from engine.errors import GrammarError
from engine.generation import grammars
from engine.generation.session import LoadOptions, Session
from tests.engine import conftest
from tests.engine.conftest import synth

PROMPT = " the river model"
run = partial(conftest.run, prompt=PROMPT, max_tokens=120, record_drafts=True)  # MTP to a depth, or plain
# a finite language: the output must end, whatever the weights prefer
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ids", "ok", "kind"],
          "properties": {"ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
                                 "minItems": 4, "maxItems": 4},
                         "ok": {"type": "boolean"}, "kind": {"enum": ["river", "valley", "model"]}}}


@pytest.fixture(scope="module", params=[("glm4moe", "mixed", 5), ("qwen35", "mixed", 1)],
                ids=["glm4moe-mixed", "qwen35-mixed"])
def session(request):
    arch, weights, seed = request.param
    model = synth(arch, weights, reads="hidden", seed=seed)
    opened = Session(LoadOptions(path=str(model.path("combined")), n_ctx=1024))
    yield opened
    opened.close()


def test_greedy_output_under_a_json_schema_is_the_same_with_and_without_mtp(session):
    gbnf = grammars.from_json_schema(SCHEMA)
    plain = run(session, None, grammar=gbnf)
    assert plain.finish_reason == "stop", plain.text  # the grammar ended it, not the token limit
    value = json.loads(plain.text)
    assert len(value["ids"]) == 4 and value["kind"] in ("river", "valley", "model") and isinstance(value["ok"], bool)
    for n_max in (1, 3):
        for guided in (True, False):
            spec = run(session, n_max, grammar=gbnf, guided_drafts=guided)
            assert spec.tokens == plain.tokens, (n_max, guided)
            assert spec.stats.rounds > 0 and spec.stats.drafted > 0
    # drafting freely, the head proposes what breaks the grammar: rejected, at a cost in acceptance only;
    # guided by the grammar it drafts what the grammar allows, and the forced structure is accepted
    free_drafts = run(session, 3, grammar=gbnf, guided_drafts=False).stats
    guided = run(session, 3, grammar=gbnf).stats
    assert free_drafts.accepted < free_drafts.drafted
    assert guided.accepted / guided.drafted > free_drafts.accepted / free_drafts.drafted
    free = run(session, 3, max_tokens=len(plain.tokens))
    assert free.tokens != plain.tokens  # the grammar changed the output (the test would prove nothing otherwise)


def test_any_json_object_mode_gives_an_object():
    session = Session(LoadOptions(path=str(synth("glm4moe", "random", reads="hidden", seed=5).path("combined")),
                                  n_ctx=1024))
    try:
        result = run(session, 3, grammar=grammars.from_json_schema({}), max_tokens=60)
        assert result.text.startswith("{")  # an object begins, even if 60 tokens do not close it
        assert run(session, None, grammar=grammars.from_json_schema({}), max_tokens=60).tokens == result.tokens
    finally:
        session.close()


def test_a_grammar_llama_cpp_cannot_parse_is_a_grammar_error_and_the_session_still_works(session):
    with pytest.raises(GrammarError):
        run(session, 3, grammar='root ::= "unterminated')
    with pytest.raises(GrammarError):
        grammars.from_json_schema([1, 2])
    assert run(session, 3, max_tokens=8).tokens == run(session, None, max_tokens=8).tokens


def test_logit_bias_bans_a_token_with_and_without_mtp(session):
    plain = run(session, None, max_tokens=24)
    banned = plain.tokens[1]
    biased = run(session, None, max_tokens=24, logit_bias=((banned, float("-inf")),))
    assert banned not in biased.tokens and biased.tokens[:1] == plain.tokens[:1]
    assert run(session, 3, max_tokens=24, logit_bias=((banned, float("-inf")),)).tokens == biased.tokens


def test_logprobs_come_from_the_verify_rows_and_match_plain_decoding(session):
    plain = run(session, None, max_tokens=24, logprobs=3)
    spec = run(session, 3, max_tokens=24, logprobs=3)
    assert spec.tokens == plain.tokens and spec.stats.accepted > 0
    assert len(plain.logprobs) == len(plain.tokens) == len(spec.logprobs)
    worst = 0.0
    for a, b in zip(plain.logprobs, spec.logprobs, strict=True):
        assert a["token"] == b["token"] and len(a["top"]) == len(b["top"]) == 3
        assert a["top"][0]["token"] == a["token"]  # greedy: the chosen token is the likeliest
        assert a["logprob"] <= 0 and sum(math.exp(t["logprob"]) for t in a["top"]) <= 1 + 1e-6
        worst = max(worst, abs(a["logprob"] - b["logprob"]))
    # a verify row and a one-row decode differ only by floating-point batch noise
    assert worst < 1e-2, worst


def test_under_a_grammar_the_head_drafts_only_what_the_grammar_allows(session):
    from engine.runtime import Sampler, SamplingParams

    gbnf = grammars.from_json_schema(SCHEMA)
    result = run(session, 3, grammar=gbnf)
    assert result.drafts_per_round and all(len(d) == 3 for d in result.drafts_per_round)  # every round drafted
    checker = Sampler(SamplingParams(), session.model.n_vocab, vocab=session.model.vocab, grammar=gbnf)
    guide = checker.draft_guide()
    try:
        emitted = 1  # the first token is sampled after the prefill, before any round
        for drafts, accepted in zip(result.drafts_per_round, result.accepted_per_round, strict=True):
            guide.start()
            for token in result.tokens[:emitted]:  # the grammar's state after what was emitted
                assert guide.choose([token]) == token
            for draft in drafts:  # each draft is allowed after the drafts before it
                assert guide.choose([draft]) == draft
            emitted += accepted + 1
    finally:
        guide.end()
        checker.close()


def test_a_lazy_grammar_leaves_the_text_free_until_its_trigger_then_holds_it(session):
    # what auto tool calls use: free text until the call marker, then a well-formed call
    free = run(session, None, max_tokens=40)
    words = free.text.split(" ")
    trigger = " " + next(w for w in words[3:] if w and w.isalpha())
    start = free.text.index(trigger)
    gbnf = f'root ::= "{trigger}" " = " [0-9] [0-9] [0-9]'
    plain = run(session, None, max_tokens=60, grammar=gbnf, grammar_triggers=(re.escape(trigger),))
    assert plain.text.startswith(free.text[:start + len(trigger)])  # untouched up to and through the trigger
    assert re.fullmatch(r" = [0-9]{3}", plain.text[start + len(trigger):]), plain.text
    assert plain.finish_reason == "stop"  # the grammar ended it
    for n_max in (1, 3):
        assert run(session, n_max, max_tokens=60, grammar=gbnf, grammar_triggers=(re.escape(trigger),)).tokens \
            == plain.tokens


def test_a_grammar_waits_for_the_end_of_a_thinking_block_the_prompt_opened(session):
    # Qwen3.5's generation prompt ends inside <think>: a JSON schema or a forced tool call must hold the
    # answer, not the reasoning, so the grammar starts at </think> (a lazy grammar triggered there)
    thinking = "{% for m in messages %}{{ m['content'] }}{% endfor %} answer:<think>\n"
    closed = "{% for m in messages %}{{ m['content'] }}{% endfor %} answer:<think></think>"
    messages = ({"role": "user", "content": PROMPT},)
    grammar = 'root ::= "x" "y"'
    free = run(session, None, prompt=None, messages=messages, template=thinking, split_reasoning=True,
               max_tokens=24)
    raw = run(session, None, prompt=None, messages=messages, template=thinking, split_reasoning=True,
              max_tokens=24, grammar=grammar, grammar_after_thinking=False)
    assert raw.reasoning == "xy" and raw.finish_reason == "stop"  # a raw grammar holds the reasoning too
    held = run(session, None, prompt=None, messages=messages, template=thinking, split_reasoning=True,
               max_tokens=24, grammar=grammar)
    assert held.tokens == free.tokens and held.reasoning and not held.text  # thinking is free
    assert run(session, 3, prompt=None, messages=messages, template=thinking, split_reasoning=True,
               max_tokens=24, grammar=grammar).tokens == held.tokens
    answer = run(session, None, prompt=None, messages=messages, template=closed, split_reasoning=True,
                 max_tokens=24, grammar=grammar)
    assert answer.text == "xy" and answer.finish_reason == "stop"  # no block open: the grammar holds at once

import json

import pytest

from engine.errors import ProtocolError
from engine.sampling import SamplingParams
from engine.speculative.settings import MAX_DRAFT, SPECULATION_OFF, SpeculativeSettings, mtp
from engine.speculative.stats import StatsSnapshot
from engine.worker import protocol as P


def test_sampling_travels_whole_with_llama_cpps_names():
    sampling = SamplingParams(temperature=0.7, top_k=0, top_p=0.9, min_p=0.1, seed=7, repeat_penalty=1.1,
                              repeat_last_n=-1, presence_penalty=0.5, frequency_penalty=-0.5)
    msg = P.GenerateRequestMsg(id="g2", prompt="x", sampling=sampling)
    assert P.decode_request(P.encode(msg)) == msg
    assert json.loads(P.encode(msg))["sampling"]["repeat_last_n"] == -1  # one object, never flat fields
    assert msg.sampling.history_length(4096) == 4096  # -1: the whole context, as in llama.cpp
    # a sampling object that leaves fields out takes SamplingParams' defaults, penalties off
    partial = P.decode_request('{"type": "generate", "id": "a", "prompt": "x", "sampling": {"temperature": 0.5}}')
    assert partial.sampling == SamplingParams(temperature=0.5) and not partial.sampling.penalised


def test_a_version_4_request_with_flat_sampling_fields_is_refused_by_name():
    with pytest.raises(ProtocolError, match=r"unknown field\(s\) \['seed', 'temperature'\]"):
        P.decode_request('{"type": "generate", "id": "a", "prompt": "x", "temperature": 0.5, "seed": 3}')
    assert P.PROTOCOL_VERSION == 8


def test_speculative_settings_carry_their_draft_sampling():
    request = P.decode_request('{"type": "generate", "id": "a", "prompt": "x", '
                               '"speculative": {"mode": "mtp", "draft_sampling": "probabilistic"}}')
    assert request.speculative.draft_sampling == "probabilistic"
    assert P.decode_request(P.encode(request)).speculative == request.speculative
    with pytest.raises(ProtocolError, match="draft_sampling must be one of"):
        P.decode_request('{"type": "generate", "id": "a", "speculative": {"draft_sampling": "greedy"}}')


def test_generate_request_round_trips_through_json():
    msg = P.GenerateRequestMsg(id="g1", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                               stop=["\n"], speculative=SpeculativeSettings("mtp", 2, 0, 0.5))
    assert P.decode_request(P.encode(msg)) == msg


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": "frobnicate", "id": "x"}', "unknown request type"),
        ('{"type": "load"}', "missing field 'id'"),
        ('{"type": "load", "id": "a", "options": {"n_ctx": "big"}}', "load.options.n_ctx: expected an integer"),
        ('{"type": "load", "id": "a", "options": {"n_ctx": true}}', "expected an integer"),
        ('{"type": "load", "id": "a", "options": {"rpc": "h:1"}}', "load.options.rpc: expected a list"),
        ('{"type": "load", "id": "a", "n_ctx": 512}', r"unknown field\(s\) \['n_ctx'\]"),  # version 4's flat fields
        ('{"type": "generate", "id": "a", "stop": "x"}', "expected a list"),
        ('{"type": "generate", "id": "a", "speculative": {"n_max": 2, "bogus": 1}}', "unknown field"),
        ('{"type": "cancel", "id": "a", "extra": 1}', "unknown field"),
        ('{"type": "generate", "id": "a", "speculative": {"mode": "none"}}', "speculative: mode must be one of"),
        ('{"type": "generate", "id": "a", "speculative": {"mode": "mtp", "n_max": 99}}', "n_max must be"),
        ('{"type": "generate", "id": "a", "speculative": {"p_min": -0.5}}', "p_min must be"),
        ('{"type": "generate", "id": "a", "sampling": {"top_p": 1.5}}', "sampling: top_p must be a number from 0 to 1"),
        ('{"type": "generate", "id": "a", "sampling": {"top_k": -5}}', "top_k must be an integer"),
        ('{"type": "generate", "id": "a", "sampling": {"repeat_penalty": 0}}', "repeat_penalty must be"),
        ('{"type": "generate", "id": "a", "sampling": {"repeat_last_n": -2}}', "repeat_last_n must be"),
        ('{"type": "generate", "id": "a", "sampling": {"presence_penalty": 3}}', "presence_penalty must be"),
        ('{"type": "generate", "id": "a", "sampling": {"frequency_penalty": "lots"}}', "frequency_penalty: expected"),
        ('{"type": "generate", "id": "a", "sampling": {"seed": -1}}', "seed must be an integer from 0"),
        ('{"type": "generate", "id": "a", "sampling": {"temperature": 1e400}}', "temperature must be"),
    ],
)
def test_malformed_requests_are_refused_with_the_reason(line, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        P.decode_request(line)


def test_request_id_is_recovered_from_a_bad_request_when_possible():
    assert P.request_id('{"type": "nope", "id": "r7"}') == "r7"
    assert P.request_id("{broken") is None


def test_numbers_are_accepted_as_floats_but_not_as_strings():
    req = P.decode_request('{"type": "generate", "id": "a", "prompt": "x", "sampling": {"temperature": 1}}')
    assert req.sampling.temperature == 1.0 and isinstance(req.sampling.temperature, float)


def test_off_is_spelled_one_way_and_the_deepest_draft_is_decided_once():
    assert SpeculativeSettings() == SPECULATION_OFF and SPECULATION_OFF.label == "off"
    assert not SPECULATION_OFF.enabled and SpeculativeSettings("mtp", 2).label == "mtp n_max=2"
    with pytest.raises(ValueError):
        SpeculativeSettings("mtp", MAX_DRAFT + 1)
    assert SpeculativeSettings("mtp", 5).limited_to(3).n_max == 3
    assert SpeculativeSettings("mtp", 5).limited_to(0) == SpeculativeSettings("off", 5)


@pytest.mark.parametrize("event", [
    P.ReadyEvent(2, 99, P.EngineBuild("0.3.36", "cpu", cmake_args=["-DX=1"]), max_draft=8),
    P.LoadedEvent("r1", P.ModelInfo(path="/m.gguf", architecture="gemma3", mtp="single", max_draft=8)),
    P.TokenEvent("r2", "héllo", draft=True),
    P.PrefillEvent("r2", 512, 1300),
    P.StatsEvent("r2", StatsSnapshot(settings=mtp(3), rounds=2, drafted_per_pos=[2, 1],
                                     phase_seconds={"draft": 0.5})),
    P.DoneEvent("r2", "length", StatsSnapshot(generated_tokens=4), "template", 4),
    P.DoneEvent("r5", "stop", StatsSnapshot(generated_tokens=4, drafted=3, accepted=2, sequence=3), "template", 4),
    P.DoneEvent("r3", "error"),
    P.ErrorEvent(None, "protocol", "bad", final=True),
    P.UnloadedEvent("r4"),
    P.ByeEvent(None),
])
def test_every_event_round_trips_through_json(event):
    assert P.decode_event(P.encode(event)) == event


@pytest.mark.parametrize("line, fragment", [
    ('{"type": "token", "id": "a"}', "missing field 'text'"),
    ('{"type": "token", "id": "a", "text": 3}', "token.text: expected a string"),
    ('{"type": "done", "id": "a", "finish_reason": "stop", "stats": {"rounds": "many"}}', "stats.rounds"),
    ('{"type": "teleported", "id": "a"}', "unknown event type"),
    ('{"type": "bye", "id": null, "extra": 1}', "unknown field"),
])
def test_malformed_events_are_refused_with_the_reason(line, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        P.decode_event(line)


def test_deeply_nested_json_is_a_protocol_error_not_a_crash():
    with pytest.raises(ProtocolError, match="nested"):
        P.decode_request("[" * 100_000 + "]" * 100_000)
    assert P.request_id("[" * 100_000 + "]" * 100_000) is None


def test_bytes_that_are_not_utf8_are_a_protocol_error():
    with pytest.raises(ProtocolError, match="UTF-8"):
        P.decode_request(b'{"type": "generate", "id": "a", "prompt": "caf\xe9"}')


def test_cancel_is_acknowledged_with_a_final_event():
    ack = P.AckEvent("c1", target="g1")
    assert P.decode_event(P.encode(ack)) == ack and P.is_final(ack)


def test_images_travel_as_base64_beside_markers_in_the_text():
    msg = P.GenerateRequestMsg(id="i", prompt=f"{P.IMAGE_MARKER} What is this?", images=["iVBORw0KGgo="])
    assert P.decode_request(P.encode(msg)) == msg
    with pytest.raises(ProtocolError, match=r"generate.images\[0\]: expected a string"):
        P.decode_request('{"type": "generate", "id": "a", "prompt": "x", "images": [3]}')
    load = P.decode_request('{"type": "load", "id": "l", "options": {"path": "m.gguf", "mmproj": "mmproj-m.gguf"}}')
    assert load.options.mmproj == "mmproj-m.gguf"

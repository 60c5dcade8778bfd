import pytest

from engine.errors import ProtocolError
from engine.worker import protocol as P


def test_generate_request_round_trips_through_json():
    msg = P.GenerateRequestMsg(id="g1", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                               stop=["\n"], speculative=P.SpeculativeSettings("mtp", 2, 0, 0.5))
    assert P.decode_request(P.encode(msg)) == msg


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": "frobnicate", "id": "x"}', "unknown request type"),
        ('{"type": "load"}', "missing field 'id'"),
        ('{"type": "load", "id": "a", "n_ctx": "big"}', "load.n_ctx: expected an integer"),
        ('{"type": "load", "id": "a", "n_ctx": true}', "expected an integer"),
        ('{"type": "generate", "id": "a", "stop": "x"}', "expected a list"),
        ('{"type": "generate", "id": "a", "speculative": {"n_max": 2, "bogus": 1}}', "unknown field"),
        ('{"type": "cancel", "id": "a", "extra": 1}', "unknown field"),
    ],
)
def test_malformed_requests_are_refused_with_the_reason(line, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        P.decode_request(line)


def test_request_id_is_recovered_from_a_bad_request_when_possible():
    assert P.request_id('{"type": "nope", "id": "r7"}') == "r7"
    assert P.request_id("{broken") is None


def test_numbers_are_accepted_as_floats_but_not_as_strings():
    req = P.decode_request('{"type": "generate", "id": "a", "prompt": "x", "temperature": 1}')
    assert req.temperature == 1.0 and isinstance(req.temperature, float)

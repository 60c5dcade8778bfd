"""`mtp-studio chat`'s sampling flags: a preset, then each flag given on top of it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.cli import build_parser, sampling_from_args
from engine.sampling import BALANCED, SamplingParams
from engine.worker import protocol as P


def parse(*argv: str):
    return build_parser().parse_args(["chat", "hello", *argv])


def test_without_flags_the_terminal_chat_is_plain_greedy():
    assert sampling_from_args(parse()) == SamplingParams()


def test_a_preset_is_the_base_and_each_flag_overrides_one_field():
    sampling = sampling_from_args(parse("--preset", "balanced", "--seed", "7", "--presence-penalty", "0.5"))
    assert sampling == replace(BALANCED, seed=7, presence_penalty=0.5)
    request = P.GenerateRequestMsg(id="1", prompt="x", sampling=sampling)  # the request carries it whole
    assert P.decode_request(P.encode(request)).sampling == sampling


def test_a_value_out_of_range_names_the_field():
    with pytest.raises(ValueError, match="top_p"):
        sampling_from_args(parse("--top-p", "3"))

"""Streaming text: UTF-8 safe detokenization and stop strings."""

from engine.generation.detokenizer import Detokenizer
from engine.generation.stops import StopMatcher


def test_multibyte_character_split_over_tokens_is_held_back_until_complete():
    pieces = {1: "é".encode()[:1], 2: "é".encode()[1:] + b"!", 3: b"\xf0\x9f", 4: b"\x98\x80"}
    detok = Detokenizer(pieces.__getitem__)
    assert detok.push(1) == ""
    assert detok.push(2) == "é!"
    assert detok.push(3) == ""
    assert detok.push(4) == "😀"
    assert detok.flush() == ""


def test_incomplete_character_at_the_end_becomes_a_replacement():
    detok = Detokenizer({1: b"\xe2\x82"}.__getitem__)
    assert detok.push(1) == ""
    assert detok.flush() == "\ufffd"


def test_stop_string_split_across_chunks_is_never_shown():
    stops = StopMatcher(["</end>"])
    shown = [stops.feed(chunk) for chunk in ["Hello <", "/en", "d> more"]]
    assert "".join(shown) == "Hello "
    assert stops.matched == "</end>"
    assert stops.feed("anything") == ""


def test_text_that_only_looked_like_a_stop_prefix_is_released():
    stops = StopMatcher(["STOP"])
    assert stops.feed("a ST") == "a "
    assert stops.feed("OCK") == "STOCK"
    assert stops.feed("x S") == "x "
    assert stops.flush() == "S"


def test_earliest_of_several_stops_wins():
    stops = StopMatcher(["bb", "a"])
    assert stops.feed("xxbba") == "xx"
    assert stops.matched == "bb"

"""Finding text that is not Unicode in a decoded JSON value, as the server and the worker's protocol do."""

from __future__ import annotations

from engine.unicode_text import first_bad_text, printable


def test_the_first_lone_surrogate_is_named_by_its_path_and_offset():
    found = first_bad_text({"model": "m", "messages": [{"role": "user", "content": "ok"},
                                                       {"role": "user", "content": "ab\ud800"}], "stop": ["\udc80"]})
    assert found is not None and (found.path, found.top, found.offset, found.name) == \
        ("messages[1].content", "messages", 2, False)
    assert "'messages[1].content'" in found.describe() and "\\ud800" in found.describe()


def test_a_name_that_is_not_unicode_is_shown_escaped():
    found = first_bad_text({"temperature\udfff": 1})
    assert found is not None and found.name and found.top == "temperature\\udfff"
    found.describe().encode("utf-8")  # what the error says can be sent


def test_valid_text_of_any_script_passes_and_deep_nesting_does_not_recurse():
    assert first_bad_text({"prompt": "日本語 😀 café", "stop": ["\u2028"], "n": [1, 2.5, None, True]}) is None
    deep: object = "x\ud800"
    for _ in range(20_000):
        deep = [deep]
    found = first_bad_text({"a": deep})
    assert found is not None and found.top == "a"


def test_printable_escapes_only_the_surrogates():
    assert printable("a\ud800b é") == "a\\ud800b é"

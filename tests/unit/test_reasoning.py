"""The split of a reply into its thinking block and its answer, as the text streams."""

from __future__ import annotations

import pytest

from engine.generation.reasoning import ReasoningSplit


def split(inside: bool, pieces: list[str]) -> tuple[str, str]:
    splitter, out = ReasoningSplit(inside), []
    for piece in pieces:
        out += splitter.feed(piece)
    out += splitter.flush()
    return "".join(t for t, r in out if r), "".join(t for t, r in out if not r)


@pytest.mark.parametrize("pieces", [["plan a</think>\n\nanswer"], ["plan", " a</th", "ink>", "\n\nans", "wer"],
                                    list("plan a</think>\n\nanswer")])
def test_a_block_the_prompt_opened_ends_at_its_tag_however_the_tokens_cut_it(pieces):
    assert split(True, pieces) == ("plan a", "answer")


def test_a_block_the_reply_opens_itself():
    assert split(False, ["\n<th", "ink>\nhmm</think>\n\nok"]) == ("hmm", "ok")


def test_a_tag_inside_the_answer_is_text():
    assert split(False, ["Use <think> tags like ", "<think>x</think>"]) == (
        "", "Use <think> tags like <think>x</think>")
    assert split(True, ["a</think>b <think>c</think>"]) == ("a", "b <think>c</think>")


def test_what_is_held_at_the_end_is_what_it_was_taken_for():
    assert split(True, ["never closed </thi"]) == ("never closed </thi", "")
    assert split(False, ["<thi"]) == ("", "<thi")
    assert split(False, []) == ("", "")

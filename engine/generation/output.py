"""Accepted tokens become visible text here; this is also where a generation decides it ended.

Tokens go through the detokenizer (whole UTF-8 characters only), the stop
strings (text that might start one is held back) and, with ``split_reasoning``,
the thinking-block split; each visible piece goes to the request's callbacks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.generation.detokenizer import Detokenizer
from engine.generation.reasoning import ReasoningSplit
from engine.generation.stops import StopMatcher
from engine.runtime.model import Model


class Output:
    """Turns accepted tokens into visible text; decides when generation ends (``finish``)."""

    def __init__(self, model: Model, stop: tuple[str, ...], max_tokens: int, split_reasoning: bool,
                 on_text: Callable[[str, bool], None] | None,
                 on_reasoning: Callable[[str], None] | None = None, opens_thinking: bool = False,
                 on_text_logprobs: Callable[[str, bool, list[dict[str, Any]]], None] | None = None) -> None:
        self.model = model
        self.on_text_logprobs = on_text_logprobs
        self.split = ReasoningSplit(opens_thinking) if split_reasoning else None
        self.on_reasoning = on_reasoning
        self.reasoning: list[str] = []
        # the logprobs of tokens pushed since the last answer text went out (a stream sends them with it)
        self.unsent_logprobs: list[dict[str, Any]] = []
        self.detok = Detokenizer(self.model.piece)
        self.stops = StopMatcher(stop)
        self.max_tokens = max_tokens
        self.on_text = on_text
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.finish: str | None = None
        self.margins: list[float] = []
        self.logprobs: list[dict[str, Any]] = []

    def push(self, token: int, from_draft: bool, margin: float | None = None,
             logprob: dict[str, Any] | None = None) -> None:
        if margin is not None:
            self.margins.append(margin)
        if self.model.is_eog(token):
            self.finish = "stop"
            return
        self.tokens.append(token)
        if logprob is not None:
            self.logprobs.append(logprob)
            self.unsent_logprobs.append(logprob)
        self._show(self.stops.feed(self.detok.push(token)), from_draft)
        if self.stops.matched is not None:
            self.finish = "stop"
        elif len(self.tokens) >= self.max_tokens:
            self.finish = "length"

    def _show(self, shown: str, from_draft: bool, last: bool = False) -> None:
        pieces = [(shown, False)] if self.split is None else self.split.feed(shown)
        if last and self.split is not None:
            pieces += self.split.flush()
        for text, reasoning in pieces:
            if not text:
                continue
            if reasoning:
                self.reasoning.append(text)
                if self.on_reasoning:
                    self.on_reasoning(text)
            else:
                self.text.append(text)
                if self.on_text_logprobs:
                    self.on_text_logprobs(text, from_draft, self.unsent_logprobs)
                elif self.on_text:
                    self.on_text(text, from_draft)
                self.unsent_logprobs = []

    def close(self) -> None:
        self._show(self.stops.feed(self.detok.flush()) + self.stops.flush(), False, last=True)

"""Paired timing: one setting of the session against others on the same prompts.

Thread counts (threads.py) and the draft vocabulary (draft_vocab.py) are
chosen the same way: every option replies to each prompt, one after the
other, in an order that alternates between prompts (so a machine warming up
or slowing down favours none of them), with the same seed per prompt; the
caller turns the replies into speed ratios against its baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TypeVar

from engine.autotune.search import seeded
from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.session import Session
from engine.sampling import GREEDY, SamplingParams
from engine.speculative.settings import SpeculativeSettings

Option = TypeVar("Option", bound=Hashable)


def paired_replies(session: Session, prompts: Sequence[list[dict[str, str]]], options: Sequence[Option],
                   apply: Callable[[Option], None], spec: SpeculativeSettings, *, max_tokens: int,
                   sampling: SamplingParams = GREEDY, label: Callable[[Option], str] = str,
                   progress: Callable[[str], None] | None = None) -> Iterator[dict[Option, GenerateResult]]:
    """For each prompt, every option's reply (``apply`` sets an option on the session first), in
    ``options``' order on even prompts and the reverse on odd ones."""
    for i, messages in enumerate(prompts):
        order = list(options) if i % 2 == 0 else list(reversed(options))
        replies: dict[Option, GenerateResult] = {}
        for option in order:
            apply(option)
            replies[option] = generate(session, GenerateRequest(messages=tuple(messages), max_tokens=max_tokens,
                                                                sampling=seeded(sampling, i), speculative=spec))
            if progress:
                progress(f"{label(option)}: {replies[option].stats.decode_tps() or 0.0:.1f} tok/s")
        yield replies

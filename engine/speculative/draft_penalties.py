"""The request's repetition penalties on the MTP head's logits, so it drafts what the penalised target picks.

A request with a repeat, frequency or presence penalty changes the target's
logits for every token in its recent history; a head that drafts its raw
argmax proposes exactly the repetitions the penalties push the target away
from, and loses acceptance for nothing. Here the head's row gets the same
penalties as llama.cpp's penalties stage gives the target's row (the same
formula, ``llama_sampler_penalties_apply``), over the history the target will
have at that row: the tokens the context holds, ``id_last``, and the round's
earlier drafts. Only the draft changes; the target still verifies it with its
own sampler, so the output is what it is without this.

Only the history's tokens are touched (at most ``repeat_last_n`` of them), so a
draft step costs no pass over a 150,000-token vocabulary.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

import numpy as np

from engine.sampling import SamplingParams


class DraftPenalties:
    """Penalties for one request's drafts; ``history()`` gives the tokens before ``id_last`` and ``id_last``."""

    def __init__(self, params: SamplingParams, last_n: int, history: Callable[[], list[int]]) -> None:
        self.repeat, self.frequency, self.presence = params.repeat_penalty, params.frequency_penalty, \
            params.presence_penalty
        self.last_n = last_n
        self.history = history
        self._window: deque[int] = deque()
        self._counts: Counter[int] = Counter()

    @classmethod
    def of(cls, params: SamplingParams, n_ctx: int, history: Callable[[], list[int]]) -> DraftPenalties | None:
        """The request's penalties, or None where it has none (llama.cpp's stage is then off too)."""
        last_n = n_ctx if params.repeat_last_n < 0 else params.repeat_last_n
        if last_n == 0 or (params.repeat_penalty == 1.0 and not params.frequency_penalty
                           and not params.presence_penalty):
            return None
        return cls(params, last_n, history)

    def start(self) -> None:
        """A round begins: the window is the history's last ``last_n`` tokens."""
        self._window = deque(self.history()[-self.last_n:])
        self._counts = Counter(self._window)

    def apply(self, logits: np.ndarray) -> None:
        """Penalise ``logits`` (one row, in place) as the target's penalties stage would."""
        for token, count in self._counts.items():
            if 0 <= token < logits.shape[0]:
                logit = float(logits[token])
                logit = logit * self.repeat if logit <= 0 else logit / self.repeat
                logits[token] = logit - count * self.frequency - self.presence

    def accept(self, token: int) -> None:
        """The round drafted ``token``: the next draft's row sees it in the history."""
        self._window.append(token)
        self._counts[token] += 1
        if len(self._window) > self.last_n:
            old = self._window.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]

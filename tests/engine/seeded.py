"""Comparing seeded sampling with and without speculation.

Seeded sampling draws one number per emitted token, speculative or not, so
the outputs are the same while the logits are. A verify row's logits differ
from a one-row decode's by numeric noise, and a draw that lands that close to
a boundary of the distribution may pick the neighbouring token (seen on an
AVX2 EPYC at token 12 of 48 on glm4moe mixed seed 1, where plain's top-2 logit
margin, which decides greedy partings, is 0.38 and says nothing about it). So
the outputs must be equal up to their first parting, and at a parting the
rows they sampled from must differ: the same logits sampled into another
token is a defect of the sampler's state (its history, its penalties).
"""

from __future__ import annotations

import numpy as np


def record_sampled_rows(session, monkeypatch) -> list[np.ndarray]:  # noqa: ANN001
    """The logits of every row the sampler draws from, in order (a spy on Sampler.sample)."""
    from engine.runtime.sampler import Sampler

    rows: list[np.ndarray] = []
    original = Sampler.sample

    def spy(self, ctx_handle, row):  # noqa: ANN001
        ptr = session.target.logits(row)
        rows.append(np.ctypeslib.as_array(ptr, shape=(session.model.n_vocab,)).copy())
        return original(self, ctx_handle, row)

    monkeypatch.setattr(Sampler, "sample", spy)
    return rows


def assert_same_sampling(plain_tokens: list[int], plain_rows: list[np.ndarray], tokens: list[int],
                         rows: list[np.ndarray], label: str) -> None:
    n = min(len(plain_tokens), len(tokens))
    part = next((i for i in range(n) if plain_tokens[i] != tokens[i]), None)
    if part is None:
        assert tokens == plain_tokens, f"{label}: one output is a prefix of the other"
        return
    diff = float(np.abs(rows[part] - plain_rows[part]).max())
    assert diff > 0, f"{label}: token {part} differs from plain sampling on identical logits"

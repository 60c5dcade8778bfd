"""The MTP head drafts from rows penalised as the target's are (engine/speculative/draft_penalties.py).

With repetition penalties the target moves away from what it just said; a head drafting its
raw top token proposes exactly those repetitions. Penalised, its drafts are accepted more
often, and the output is unchanged (the target still verifies every draft with its sampler).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.sampling import SamplingParams
from engine.speculative.draft_penalties import DraftPenalties
from engine.speculative.mtp import MTPDrafter
from engine.speculative.settings import SPECULATION_OFF, mtp
from tests.engine.conftest import synth

# greedy, with penalties strong enough to turn the target away from the head's (oracle) choice now and then
PENALISED = SamplingParams(temperature=0.0, repeat_penalty=3.0, repeat_last_n=64, presence_penalty=2.0,
                           frequency_penalty=0.5)


def test_a_row_is_penalised_as_llama_cpps_penalties_stage_does():
    history = [3, 3, 5]
    p = DraftPenalties.of(PENALISED, 512, lambda: history)
    assert p is not None and DraftPenalties.of(SamplingParams(), 512, lambda: history) is None
    p.start()
    logits = np.array([1.0, 1.0, 1.0, 2.0, 1.0, -1.0, 1.0], dtype=np.float32)
    p.apply(logits)
    # token 3 (twice, positive logit): 2 / 3 - 2 * 0.5 - 2.0; token 5 (once, negative): -1 * 3 - 0.5 - 2.0
    assert logits[3] == pytest.approx(2 / 3 - 3.0) and logits[5] == pytest.approx(-3.0 - 2.5)
    assert list(logits[[0, 1, 2, 4, 6]]) == [1.0] * 5
    p.accept(6)  # a draft of this round counts for the next draft's row
    row = np.ones(7, dtype=np.float32)
    p.apply(row)
    assert row[6] == pytest.approx(1 / 3 - 0.5 - 2.0)


@pytest.mark.parametrize("arch", ["glm4moe"])
def test_penalised_drafts_keep_the_output_and_are_accepted_more_often(arch, monkeypatch):
    path = str(synth(arch, "oracle", agree=1.0).path())
    request = GenerateRequest(prompt=" the river model", max_tokens=96, speculative=mtp(3), sampling=PENALISED)
    with Session(LoadOptions(path=path, n_ctx=512)) as session:
        plain = generate(session, GenerateRequest(prompt=request.prompt, max_tokens=96, sampling=PENALISED,
                                                  speculative=SPECULATION_OFF))
        penalised = generate(session, request)
        real = MTPDrafter._pick

        def unpenalised(self, row, p_min):
            held, self.penalties = self.penalties, None
            try:
                return real(self, row, p_min)
            finally:
                self.penalties = held

        monkeypatch.setattr(MTPDrafter, "_pick", unpenalised)
        raw = generate(session, request)
    assert penalised.tokens == plain.tokens == raw.tokens
    # the head agrees with the target's unpenalised choice: penalised like the target, every draft is kept;
    # raw, the drafts the penalties turned the target away from are lost
    assert penalised.stats.acceptance_rate == 1.0 > raw.stats.acceptance_rate, (
        penalised.stats.acceptance_rate, raw.stats.acceptance_rate)

"""No MTP row is decoded twice (engine/speculative/mtp.py, ``skip_drafted_row``).

A looped head's first draft decode writes ``(id_last, h_target(pos0 - 1))`` at
``pos0``: the catch-up row that position needs. The next fold keeps it instead of
decoding it again. The drafts must be exactly those of decoding it again, on heads
that read the hidden state (a wrong state shows), with MTP alone, under adaptive
depth (plain steps and shadow probes) and with n-gram rounds between MTP's.
"""

from __future__ import annotations

import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import CELL_ORDER_SENSITIVE, LoadOptions, Session
from engine.speculative.adaptive import AdaptiveDepth, Costs
from engine.speculative.mtp import MTPDrafter
from engine.speculative.settings import SpeculativeSettings, mtp
from tests.engine.conftest import synth


def run(session: Session, spec: SpeculativeSettings, skip: bool, monkeypatch, policy=None) -> tuple[list, list, int]:
    monkeypatch.setattr(MTPDrafter, "skip_drafted_row", skip)
    ctx = session.mtp_drafter.ctx
    rows = [0]
    decode = ctx.decode

    def counting(batch):
        rows[0] += batch.n
        decode(batch)

    monkeypatch.setattr(ctx, "decode", counting)
    result = generate(session, GenerateRequest(prompt=" the river model", max_tokens=64, speculative=spec,
                                               record_drafts=True), policy=policy)
    monkeypatch.undo()
    return result.tokens, result.drafts_per_round, rows[0]


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35", "deepseek2", "qwen35moe", "deepseek4", "qwen3next"])
@pytest.mark.parametrize("spec", [mtp(3), mtp(3, p_min=0.6), SpeculativeSettings("mtp+ngram", 4)],
                         ids=["mtp", "gated", "mtp+ngram"])
def test_drafts_are_those_of_decoding_the_row_again_with_fewer_rows(arch, spec, monkeypatch):
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    runs = []
    for skip in (False, True):  # each on a fresh session: the n-gram map outlives a reply
        with Session(LoadOptions(path=path, n_ctx=512)) as session:
            assert session.mtp_drafter.fold, "a looped head that folds its catch-up"
            runs.append(run(session, spec, skip, monkeypatch))
    again, kept = runs
    assert kept[0] == again[0] and kept[1] == again[1]
    if arch in CELL_ORDER_SENSITIVE:  # its attention depends on where a cell sits: the row is decoded again
        assert kept[2] == again[2]
    else:
        assert kept[2] < again[2], (kept[2], again[2])  # one row fewer per MTP round


def test_adaptive_depth_with_plain_steps_and_shadow_probes_drafts_the_same(monkeypatch):
    # given costs (not timed), so both runs choose the same depths from the same acceptance: text in easy
    # and hard stretches makes it draft deep, stop, probe with shadow drafts and draft again
    path = str(synth("glm4moe", "oracle", agree=0.5, reads="hidden", run=8, seed=2).path())

    def policy() -> AdaptiveDepth:
        return AdaptiveDepth(4, costs=Costs.given({k: 1.0 + 0.5 * (k - 1) for k in range(1, 6)}, draft_step_s=0.1))

    with Session(LoadOptions(path=path, n_ctx=512)) as session:
        again = run(session, mtp(4, depth="adaptive"), False, monkeypatch, policy())
        kept = run(session, mtp(4, depth="adaptive"), True, monkeypatch, policy())
    assert kept[0] == again[0] and kept[1] == again[1]
    assert 0 < len(kept[1]) < len(kept[0]) - 8  # it drafted, and took plain steps too
    assert kept[2] < again[2]

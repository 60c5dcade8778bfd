"""A draft vocabulary (``LoadOptions.draft_vocab``, patch 0008's ``llama_set_mtp_n_vocab``).

The MTP head's LM head multiplies only its first ``n`` rows, so it drafts
only among token ids below ``n``. These tests run a whole-vocabulary MTP
context beside the cut one, fed every batch and every memory edit the drafter
makes, and compare each output row: the cut head's logits must be the whole
head's first ``n`` (and -inf past them), so its draft is the whole head's
argmax over those ids — on heads that read the hidden state (a wrong
hidden-state row would show in both the logits and the drafts). Output
against plain decoding on every hand-written MTP architecture and on the derived ones whose MTP
graphs the patch edits directly.
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np
import pytest

from engine.errors import ContextError
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.load_options import check_options
from engine.runtime.context import Batch, Context
from engine.speculative.settings import SPECULATION_OFF, mtp
from engine.synth.spec import ARCHITECTURES, HeadMap, SynthSpec
from engine.synth.writer import SynthModel
from tests.engine.conftest import heads_for

N_DRAFT = 2_048  # of 151,936; the synthetic maps use the first 4,094 ids, so the head drafts past it often
PROMPT = " the river model and the quiet light"


def model_152k(arch: str) -> SynthModel:
    """A tiny trunk with a real vocabulary; mixed weights, heads that read the hidden state, whose
    argmax lands anywhere in the 151,936 ids."""
    return SynthModel(SynthSpec(arch=arch, size="tiny-152k", n_heads=heads_for(arch), weights="mixed",
                                heads=(HeadMap("hidden", 0.7, 0),)))


class Shadow:
    """A whole-vocabulary MTP context that receives what the session's cut one receives, and checks every
    decode's output rows against it."""

    MIRRORED = ("seq_rm", "clear", "seq_clear", "set_nextn_layer_offset")

    def __init__(self, ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cut = ctx
        self.whole = Context(ctx.model, ctx.params)
        self.whole.set_embeddings_nextn(True, True)
        self.rows = self.past = 0
        for name in self.MIRRORED:
            monkeypatch.setattr(ctx, name, self._mirror(getattr(ctx, name), getattr(self.whole, name)))
        decode = ctx.decode

        def both(batch: Batch) -> None:
            decode(batch)
            self.whole.decode(batch)
            self._compare(batch)

        monkeypatch.setattr(ctx, "decode", both)

    @staticmethod
    def _mirror(mine, theirs):
        def call(*args, **kwargs):
            theirs(*args, **kwargs)
            return mine(*args, **kwargs)
        return call

    def _compare(self, batch: Batch) -> None:
        n_vocab, n = self.cut.n_vocab, self.cut.draft_vocab
        for i in range(batch.n):
            if not batch.logits[i]:
                continue
            cut = np.ctypeslib.as_array(self.cut.logits(i), shape=(n_vocab,)).copy()
            whole = np.ctypeslib.as_array(self.whole.logits(i), shape=(n_vocab,))
            assert np.isneginf(cut[n:]).all()
            np.testing.assert_allclose(cut[:n], whole[:n], rtol=1e-5, atol=1e-5)
            top = np.sort(whole[:n])[-2:]
            if top[1] - top[0] > 1e-4:  # not a numeric near-tie: the same pick
                assert int(cut.argmax()) == int(whole[:n].argmax())
            self.rows += 1
            self.past += int(whole.argmax()) >= n  # rows where the whole head would draft past the cut

    def close(self) -> None:
        self.whole.close()


# the hand-written architectures, and the derived ones whose MTP graphs patch 0008 edits directly
# (ggml_mul_mat on the LM head: bailingmoe3, deepseek2, deepseek4) or whose head is this project's (qwen4exp)
CUT_ARCHITECTURES = (*ARCHITECTURES, "bailingmoe3", "deepseek2", "deepseek4", "qwen4exp")


@pytest.mark.parametrize("arch", CUT_ARCHITECTURES)
def test_a_cut_head_drafts_the_whole_heads_best_among_its_ids_and_output_is_unchanged(arch, monkeypatch):
    model = model_152k(arch)
    path = str(model.path("combined"))
    with Session(LoadOptions(path=path, n_ctx=512)) as session:
        plain = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=40, speculative=SPECULATION_OFF))
    with Session(LoadOptions(path=path, n_ctx=512, draft_vocab=N_DRAFT)) as session:
        assert session.describe()["draft_vocab"] == N_DRAFT
        shadow = Shadow(session.mtp_drafter.ctx, monkeypatch)
        try:
            drafted = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=40, speculative=mtp(3),
                                                        record_drafts=True))
        finally:
            shadow.close()
    assert drafted.tokens == plain.tokens
    assert shadow.rows >= drafted.stats.drafted > 0
    assert shadow.past > 0  # the cut changed some drafts: the comparison above was not vacuous
    assert all(t < N_DRAFT for d in drafted.drafts_per_round for t in d)


def test_the_cut_changes_the_graph_and_back(monkeypatch):
    """Switching the draft vocabulary on a live context takes effect at the next decode (llama.cpp keys
    graph reuse on it): the same row decoded whole, cut, and whole again."""
    with Session(LoadOptions(path=str(model_152k("glm4moe").path("combined")), n_ctx=512)) as session:
        ctx = session.mtp_drafter.ctx
        batch = Batch(4, ctx.model.n_embd_out)
        state = np.random.default_rng(0).standard_normal(ctx.model.n_embd_out).astype(np.float32)

        def decode() -> np.ndarray:
            ctx.seq_rm(0)
            batch.clear()
            batch.add(17, 0, True)
            ctypes.memmove(batch.embd_row_address(0), state.ctypes.data, state.nbytes)
            ctx.decode(batch)
            return np.ctypeslib.as_array(ctx.logits(0), shape=(ctx.n_vocab,)).copy()

        whole = decode()
        assert ctx.set_draft_vocab(N_DRAFT) == N_DRAFT
        cut = decode()
        assert ctx.set_draft_vocab(0) == ctx.n_vocab
        again = decode()
    assert np.isfinite(whole).all() and np.isfinite(again).all()
    np.testing.assert_allclose(cut[:N_DRAFT], whole[:N_DRAFT], rtol=1e-5, atol=1e-5)
    assert np.isneginf(cut[N_DRAFT:]).all()
    np.testing.assert_array_equal(again, whole)


def test_a_draft_vocabulary_as_large_as_the_vocabulary_is_the_whole_one():
    with Session(LoadOptions(path=str(model_152k("glm4moe").path("combined")), n_ctx=512,
                             draft_vocab=200_000)) as session:
        assert session.mtp_drafter.ctx.draft_vocab == session.model.n_vocab


@pytest.mark.parametrize("bad", [1, 1023, -5, True])
def test_a_draft_vocabulary_too_small_to_hold_common_words_is_refused(bad):
    with pytest.raises(ContextError, match="draft_vocab"):
        check_options(LoadOptions(draft_vocab=bad))


def test_autotune_times_the_cut_against_the_whole_vocabulary_and_leaves_the_winner_set():
    from engine.autotune import draft_vocab

    prompts = [[{"role": "user", "content": t}] for t in (" the river", " a model of light", " water")]
    spec = mtp(2)
    with Session(LoadOptions(path=str(model_152k("glm4moe").path("combined")), n_ctx=512)) as session:
        assert draft_vocab.worth_trying(session, spec) and not draft_vocab.worth_trying(session, SPECULATION_OFF)
        choice = draft_vocab.choose(session, prompts, spec, max_tokens=16)
        rows = {m.draft_vocab: m for m in choice.measurements}
        # both cuts are at most half of 151,936 tokens
        assert set(rows) == {0, 65_536, 32_768} and rows[0].ratios == [1.0] * 3  # the baseline against itself
        assert all(len(m.tps) == 3 and min(m.tps) > 0 for m in rows.values())
        assert choice.draft_vocab in rows
        assert session.mtp_drafter.ctx.draft_vocab == (choice.draft_vocab or session.model.n_vocab)
        assert session.options.draft_vocab == choice.draft_vocab
        assert "draft vocabulary" in choice.table() and choice.reason.startswith("the head drafts among")


def test_autotune_does_not_try_a_cut_where_the_vocabulary_is_small():
    from engine.autotune import draft_vocab
    from tests.engine.conftest import synth

    with Session(LoadOptions(path=str(synth("glm4moe", "oracle").path()), n_ctx=512)) as session:
        assert not draft_vocab.worth_trying(session, mtp(2))


def test_the_command_stores_the_draft_vocabulary_it_chose(monkeypatch, tmp_path):
    import argparse

    from engine.autotune import cli
    from engine.autotune import messages as M
    from engine.autotune.profiles import ProfileStore, model_identity
    from engine.hardware.probe import probe

    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path))
    model = model_152k("glm4moe").path("combined")
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["autotune", str(model), "--prompts", "3", "--tokens", "12", "--n-max", "2",
                              "--thread-options", "none", "--sampling", "greedy", "--jsonl"])
    lines: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: lines.append(" ".join(map(str, a))))
    assert args.func(args) == 0
    result = [M.decode(__import__("json").loads(x)) for x in lines if '"type": "result"' in x][-1]
    (profile,) = ProfileStore().all_for(probe().fingerprint(), model_identity(model),
                                        str(probe().engine.get("cache_key") or probe().engine.get("llama_cpp_python")))
    # timed before the search (whatever it then chooses), stored with the profile
    assert result.draft_vocab in (0, 65_536, 32_768) and result.draft_vocab_reason
    assert profile.draft_vocab == result.draft_vocab


def test_autotune_says_how_much_of_the_replies_a_cut_holds(monkeypatch):
    """A cut through the middle of the words this model writes holds about half of each reply's tokens,
    and the head, unable to draft the rest, is accepted less often: the table and the reason say so."""
    from engine.autotune import draft_vocab

    # the oracle model of test_mtp's real-vocabulary test: its replies are words among ids 256-4,093
    model = SynthModel(SynthSpec(arch="glm4moe", size="tiny-152k", n_heads=heads_for("glm4moe"),
                                 heads=(HeadMap("hidden", 0.7, 3),)))
    monkeypatch.setattr(draft_vocab, "CUTS", (2_048,))
    prompts = [[{"role": "user", "content": t}] for t in (" the river", " a model of light", " water")]
    with Session(LoadOptions(path=str(model.path("combined")), n_ctx=512)) as session:
        choice = draft_vocab.choose(session, prompts, mtp(2), max_tokens=32)
    whole, cut = choice.measurements
    assert whole.held == [1.0] * 3 and all(0.2 < h < 0.8 for h in cut.held), cut.held
    assert statistics.fmean(cut.acceptance) < statistics.fmean(whole.acceptance)
    assert f"{cut.held_share:5.0%}" in choice.table().splitlines()[2]
    if choice.draft_vocab:
        assert f"they hold {cut.held_share:.0%} of the replies' tokens" in choice.reason

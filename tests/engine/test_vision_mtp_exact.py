"""MTP after an image with the head's exact input (issue 28, item 3; patch 0007): each image row reaches
the MTP context with its image embedding on the token side and h_target(p-1) as the hidden state.

The reference is the slow, obviously-right way: the target decodes the prompt, and a fresh MTP context
is fed one position at a time with that position's own inputs (a text row: its token and h_target(p-1);
an image row: its embedding and h_target(p-1), at its M-RoPE positions), then drafts greedily. The
heads here read the hidden state (``mixed`` weights), so a wrong input changes the drafts.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.runtime import Batch, Context, ContextParams, state_batch
from engine.runtime.embd_batch import EmbdBatch
from engine.runtime.mtmd import IMAGE
from engine.speculative.mtp_images import EXACT, HIDDEN
from engine.speculative.settings import SpeculativeSettings
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path
from engine.worker import protocol as P

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]])
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)
PROMPT = f"Look at this: {P.IMAGE_MARKER} It shows"


def _open(synth_models: object, arch: str, layout: str = "combined", weights: str = "mixed") -> Session:
    extra = {"agree": 0.7} if weights == "mixed" else {}
    model = synth_models(arch, weights=weights, reads="hidden", seed=1, **extra)  # type: ignore[operator]
    mmproj = str(projector_path(ProjectorSpec(target=model.spec)))
    if layout == "sidecar":
        return Session(LoadOptions(path=str(model.path("trunk")), sidecar=str(model.path("sidecar")), n_ctx=1024,
                                   mmproj=mmproj))
    return Session(LoadOptions(path=str(model.path("combined")), n_ctx=1024, mmproj=mmproj))


def _mtp_context(session: Session) -> Context:
    assert session.mtp_model is not None
    ctx = Context(session.mtp_model, ContextParams(n_ctx=session.target.n_ctx, n_batch=session.target.n_batch,
                                                   n_ubatch=session.target.n_ubatch, mtp=True, n_outputs_max=1))
    ctx.set_embeddings_nextn(True, True)
    return ctx


def _reference_drafts(session: Session, image: bytes, n_max: int) -> tuple[list[int], list[float]]:
    """The first draft after the prompt, computed one MTP position at a time, and each draft token's
    top-2 logit margin."""
    assert session.projector is not None and session.mtp_model is not None
    session.prepare(mtp=True)
    target, n_embd = session.target, session.mtp_model.n_embd_out
    rows: list[tuple[int | None, np.ndarray | None, np.ndarray, np.ndarray]] = []  # token, embd, positions, h

    def image_rows(embd: np.ndarray, positions: np.ndarray) -> None:
        h = np.ctypeslib.as_array(target.embeddings_nextn(), shape=(embd.shape[0], n_embd))
        rows.extend((None, embd[r].copy(), positions[:, r].copy(), h[r].copy()) for r in range(embd.shape[0]))

    target.clear()
    pos = 0
    with session.projector.tokenize(PROMPT, [image]) as chunks:
        for i, chunk in enumerate(chunks.chunks):
            if chunk.kind == IMAGE:
                pos = chunks.decode_image(i, target, pos, image_rows)
                continue
            batch = Batch(len(chunk.tokens))
            for k, tok in enumerate(chunk.tokens):
                batch.add(tok, pos + k, k == len(chunk.tokens) - 1)
            target.decode(batch)
            h = np.ctypeslib.as_array(target.embeddings_nextn(), shape=(len(chunk.tokens), n_embd))
            rows.extend((tok, None, np.array([pos + k]), h[k].copy()) for k, tok in enumerate(chunk.tokens))
            pos += len(chunk.tokens)
    id_last = int(np.argmax(np.ctypeslib.as_array(target.logits(batch.n - 1), shape=(target.n_vocab,))))

    with _mtp_context(session) as mtp:
        prev_h = np.zeros(n_embd, dtype=np.float32)  # the drafter's pending state before the first row
        for tok, embd, positions, h in rows:
            if tok is None:
                assert embd is not None
                state_batch.decode_rows(mtp, embd[None, :], prev_h[None, :], positions[:, None])
            else:
                one = Batch(1, n_embd)
                one.add(tok, int(positions[0]), False)
                one.embd[:n_embd] = prev_h  # type: ignore[index]
                mtp.decode(one)
            prev_h = h
        drafts: list[int] = []
        margins: list[float] = []
        tok, h = id_last, prev_h
        for k in range(n_max):
            one = Batch(1, n_embd)
            one.add(tok, pos + k, True)
            one.embd[:n_embd] = h  # type: ignore[index]
            mtp.decode(one)
            logits = np.ctypeslib.as_array(mtp.logits(0), shape=(mtp.n_vocab,))
            tok = int(np.argmax(logits))
            top2 = np.sort(logits)[-2:]
            drafts.append(tok)
            margins.append(float(top2[1] - top2[0]))
            h = np.ctypeslib.as_array(mtp.embeddings_nextn_ith(0), shape=(n_embd,)).copy()
    return drafts, margins


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("weights", ["mixed", "random"])
def test_drafts_after_an_image_are_the_drafts_of_each_position_decoded_alone(synth_models: object, arch: str,
                                                                           weights: str) -> None:
    """``mixed``: the head drafts the way the tests' identity runs need; ``random``: its drafts also depend
    on the image rows it attends to, so a wrong input to them shows in the draft's margins."""
    with _open(synth_models, arch, weights=weights) as session:
        for image in (QUADRANTS, STRIPES):
            drafted, margins = {}, {}
            for rows in (EXACT, HIDDEN):
                result = generate(session, GenerateRequest(prompt=PROMPT, images=(image,), max_tokens=4,
                                                           image_rows=rows, record_drafts=True,
                                                           speculative=SpeculativeSettings("mtp", 3)))
                drafted[rows], margins[rows] = result.drafts_per_round[0], result.draft_margins_per_round[0]
            tokens, reference = _reference_drafts(session, image, len(drafted[EXACT]))
            assert list(drafted[EXACT]) == tokens, (arch, weights)
            np.testing.assert_allclose(margins[EXACT], reference, rtol=1e-3, atol=1e-3)
            if weights == "random":  # h_target in both inputs (the fallback) is another input, and it shows
                assert not np.allclose(margins[HIDDEN], reference, rtol=1e-3, atol=1e-3)


# the vision targets and the graphs that read a `tokens` input
ROW_ARCHS = ("qwen35", "qwen35moe", "step35", "mimo2", "hy_v3", "bailingmoe3")


@pytest.mark.parametrize("arch", ROW_ARCHS)
def test_an_embedding_row_writes_the_mtp_context_as_the_token_row_it_stands_for(synth_models: object,
                                                                                 arch: str) -> None:
    """Patch 0007's inputs land where llama.cpp's own hook rows put them: a row given a token's embedding
    and a hidden state writes the MTP context as the row (token id, that hidden state) does; a row with
    only an embedding takes it as both inputs (before the patch step35, mimo2, hy_v3 and bailingmoe3
    looked a stale `tokens` input up instead). Compared through the logits of a text row after it."""
    model = synth_models(arch, weights="mixed", reads="hidden", agree=0.7, seed=1)  # type: ignore[operator]
    model._build()
    table = model._stored("token_embd.weight")  # no head has embed_tokens of its own here: it reads this
    with Session(LoadOptions(path=str(model.path("combined")), n_ctx=256)) as session:
        session.prepare(mtp=True)
        assert session.mtp_model is not None
        at = np.zeros((state_batch.positions_per_row(session.target), 1), dtype=np.int32)  # position 0
        n_embd = session.mtp_model.n_embd_out
        rng = np.random.default_rng(7)
        h0, h1 = (rng.standard_normal(n_embd).astype(np.float32) for _ in range(2))
        token, follower = 11, 12

        def follower_logits(first: str, state: np.ndarray) -> np.ndarray:
            with _mtp_context(session) as mtp:
                assert state_batch.takes_states(mtp)
                if first == "token":
                    one = Batch(1, n_embd)
                    one.add(token, 0, False)
                    one.embd[:n_embd] = state  # type: ignore[index]
                    mtp.decode(one)
                elif first == "rows":
                    state_batch.decode_rows(mtp, table[token][None, :], state[None, :], at)
                elif first == "swapped":
                    state_batch.decode_rows(mtp, state[None, :], table[token][None, :], at)
                else:  # an embedding row without a state (the embedding in both inputs)
                    rows = EmbdBatch(1, n_embd, at.shape[0])
                    rows.fill(table[token][None, :], at)
                    mtp.decode(rows)  # type: ignore[arg-type]
                one = Batch(1, n_embd)
                one.add(follower, 1, True)
                one.embd[:n_embd] = h1  # type: ignore[index]
                mtp.decode(one)
                return np.ctypeslib.as_array(mtp.logits(0), shape=(mtp.n_vocab,)).copy()

        by_token = follower_logits("token", h0)
        np.testing.assert_allclose(follower_logits("rows", h0), by_token, rtol=1e-4, atol=1e-4)
        assert not np.allclose(follower_logits("swapped", h0), by_token, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(follower_logits("embedding", h0), follower_logits("token", table[token]),
                                   rtol=1e-4, atol=1e-4)


def test_a_target_context_takes_no_hidden_states(synth_models: object) -> None:
    model = synth_models("qwen35", weights="mixed", reads="hidden", agree=0.7, seed=1)  # type: ignore[operator]
    with Session(LoadOptions(path=str(model.path("combined")), n_ctx=256)) as session:
        assert not state_batch.takes_states(session.target)


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("layout", ["combined", "sidecar"])
def test_greedy_mtp_after_an_image_with_exact_rows_is_plain_greedy(synth_models: object, arch: str,
                                                                   layout: str) -> None:
    with _open(synth_models, arch, layout) as session:
        assert session.mtp_drafter is not None and state_batch.takes_states(session.mtp_drafter.ctx)
        plain = generate(session, GenerateRequest(prompt=PROMPT, images=(QUADRANTS,), max_tokens=32))
        for n_max in (1, 2, 3, 4):
            drafted = generate(session, GenerateRequest(prompt=PROMPT, images=(QUADRANTS,), max_tokens=32,
                                                        speculative=SpeculativeSettings("mtp", n_max)))
            assert drafted.tokens == plain.tokens, (arch, layout, n_max)
            assert drafted.stats.settings.mode == "mtp" and drafted.stats.drafted > 0

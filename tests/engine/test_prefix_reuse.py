"""A generation reuses what the target context holds from the last one.

Continue (the prompt extends the last context), regenerate (the same prompt
again), edit (the prompt parts in the middle) and switch (another prompt in
between), on an attention-only target, hybrids and the built-in model (SWA):
greedy output is the output without reuse (judged as engine/generation/identity.py
judges MTP, since a prompt decoded in two batches is a different batch
shape), and the statistics say how many prompt tokens were reused.
"""

from __future__ import annotations

from functools import partial

import pytest

from engine.generation import identity
from engine.generation.generator import GenerateRequest
from engine.generation.parallel import Job, ParallelGenerator
from engine.generation.session import LoadOptions, Session
from engine.generation.state_cache import StateCache
from engine.speculative.settings import MTP_NGRAM, SPECULATION_OFF, SpeculativeSettings, mtp, ngram
from tests.engine import conftest
from tests.engine.conftest import synth

TOKENS = 24
FIRST = " the river model light and the"
EDITED = " the river model LIGHT and the"
OTHER = " far away from here a"
run = partial(conftest.run, max_tokens=TOKENS)  # a reply to a prompt, plain unless asked


def reply(session: Session, spec: SpeculativeSettings, **request: object) -> object:
    """``run``; under MTP + n-gram with the n-gram map emptied first, so that its drafts depend on this
    prompt alone and a reusing run's drafts can be compared with a fresh run's round by round."""
    if spec.mode == MTP_NGRAM and session.ngram_drafter is not None:
        session.ngram_drafter.forget()
    return run(session, spec, **request)


def fresh(session: Session, prompt: str, spec: SpeculativeSettings = SPECULATION_OFF) -> object:
    """The same generation from empty contexts: what reuse must equal."""
    session.prefix.forget()
    kept, session.states = session.states, StateCache(0)  # nor a saved state (engine/generation/state_cache.py)
    try:
        result = reply(session, spec, prompt=prompt, record_margins=True, record_drafts=True)
    finally:
        session.states = kept
    assert result.stats.prompt_reused == 0
    return result


def same(session: Session, reused: object, baseline: object, drafts: bool = True) -> None:
    """Output within identity's judgement; with ``drafts``, the same drafts round by round (MTP: a head
    that reads the hidden state drafts from a wrong MTP row differently; n-gram drafts depend on the
    map's history, which reuse does not change, so they are not compared)."""
    if reused.tokens == baseline.tokens:
        if drafts:
            assert reused.drafts_per_round == baseline.drafts_per_round
        return
    verdict = identity.classify(baseline.tokens, baseline.margins, reused.tokens, identity.measure_noise(session))
    assert verdict.acceptable, verdict.describe()


def conversation(session: Session, spec: SpeculativeSettings = SPECULATION_OFF, first_prompt: str = FIRST,
                 edited: str = EDITED) -> dict[str, int]:
    """Continue, regenerate, edit, switch and back; each checked against a fresh run.

    Returns the prompt tokens each step reused, and under ``"<step> of"`` its prompt's length.
    """
    reused = {}
    first = reply(session, spec, prompt=first_prompt)
    follow = first_prompt + first.text + " and then"
    steps = [("continue", follow), ("regenerate", follow), ("edit", edited), ("switch", OTHER), ("back", follow)]
    for name, prompt in steps:
        got = reply(session, spec, prompt=prompt, record_drafts=True)
        reused[name], reused[f"{name} of"] = got.stats.prompt_reused, got.stats.prompt_tokens
        assert got.stats.prompt_tokens > reused[name], name  # the last prompt token is always decoded again
        held = list(session.prefix.tokens)
        # (adaptive depth drafts as its timings say: rounds differ from run to run, the output may not)
        same(session, got, fresh(session, prompt, spec), drafts=spec.uses_mtp and not spec.adaptive)
        session.prefix.forget()
        reply(session, spec, prompt=prompt)  # leave the context as the reusing run left it
        assert session.prefix.tokens == held, name  # and so are the tokens it holds
    return reused


@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
def test_an_attention_target_reuses_every_common_prefix(arch):
    session = Session(LoadOptions(path=str(synth(arch, "random", seed=4).path()), n_ctx=512))
    try:
        reused = conversation(session)
        assert reused["continue"] > 0
        assert reused["regenerate"] == reused["regenerate of"] - 1  # all but the token whose logits start the reply
        assert reused["edit"] > 0  # up to the edited word
        assert reused["switch"] == 0 or reused["switch"] < reused["edit"]
        # the edit cut the regenerated conversation; it was kept in host memory and came back whole
        # (engine/generation/state_cache.py; tests/engine/test_state_cache.py); where llama.cpp saves only a
        # sliding window's cells (step35), back to the window checkpoint at the prompt's end: as much
        assert reused["back"] == reused["regenerate"]
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_a_hybrid_target_reuses_up_to_its_checkpoint_and_restarts_where_it_cannot_roll_back(arch):
    session = Session(LoadOptions(path=str(synth(arch, "mixed", seed=1).path()), n_ctx=512))
    try:
        reused = conversation(session)
        assert reused["continue"] > 0  # back to the checkpoint before the last prompt's final token, or further
        assert reused["regenerate"] == reused["regenerate of"] - 1  # exactly that checkpoint
        assert reused["edit"] == 0  # parted before the checkpoint, and no snapshots without drafting: start over
    finally:
        session.close()


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-sequence", "two-sequences"])
@pytest.mark.parametrize("spec", [SPECULATION_OFF, mtp(3)], ids=["plain", "mtp"])
def test_a_hybrid_goes_back_to_its_checkpoint_at_every_regeneration(spec, parallel):
    """A regenerated reply goes back to the checkpoint before the prompt's last token, and so does the
    next regeneration of it (the checkpoint was forgotten once used: a third reply prefilled the whole
    conversation again). Output: the first reply's, every time."""
    with Session(LoadOptions(path=str(synth("qwen35", "random", seed=5).path()), n_ctx=512,
                             parallel=parallel)) as session:
        engine = ParallelGenerator(session) if parallel > 1 else None

        def one() -> object:
            if engine is None:
                return run(session, spec, prompt=FIRST * 8, record_drafts=True)
            job = Job(GenerateRequest(prompt=FIRST * 8, max_tokens=TOKENS, speculative=spec, record_drafts=True))
            engine.add(job)
            while not engine.idle:
                engine.step()
            return job.result

        first, *again = [one() for _ in range(4)]
        assert [r.stats.prompt_reused for r in again] == [first.stats.prompt_tokens - 1] * 3
        for r in again:
            assert r.tokens == first.tokens and r.drafts_per_round == first.drafts_per_round


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-sequence", "two-sequences"])
@pytest.mark.parametrize("spec", [SPECULATION_OFF, mtp(3)], ids=["plain", "mtp"])
def test_a_hybrid_goes_back_to_the_previous_prompt_for_an_edited_last_message(spec, parallel):
    """Editing the last message parts after the previous prompt's end and before the last one's: the
    checkpoint kept at the previous prompt's end (engine/generation/checkpoints.py) is reused, and only the
    last reply and the edited message are decoded (with the last prompt's checkpoint alone, the whole
    conversation was prefilled again). Output and drafts: a fresh run's."""
    path = str(synth("qwen35", "random", seed=5).path())

    def one(session: Session, engine: ParallelGenerator | None, prompt: str) -> object:
        if engine is None:
            return run(session, spec, prompt=prompt, record_drafts=True)
        job = Job(GenerateRequest(prompt=prompt, max_tokens=TOKENS, speculative=spec, record_drafts=True))
        engine.add(job)
        while not engine.idle:
            engine.step()
        return job.result

    with Session(LoadOptions(path=path, n_ctx=1024, parallel=parallel)) as session:
        engine = ParallelGenerator(session) if parallel > 1 else None
        first_prompt = FIRST * 8
        first = one(session, engine, first_prompt)
        one(session, engine, first_prompt + first.text + " and then the water")
        edited_prompt = first_prompt + first.text + " but far away"
        edited = one(session, engine, edited_prompt)
        assert edited.stats.prompt_reused == first.stats.prompt_tokens - 1
    with Session(LoadOptions(path=path, n_ctx=1024, parallel=parallel)) as session:
        alone = one(session, ParallelGenerator(session) if parallel > 1 else None, edited_prompt)
    assert edited.tokens == alone.tokens and edited.drafts_per_round == alone.drafts_per_round


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-sequence", "two-sequences"])
@pytest.mark.parametrize("spec", [SPECULATION_OFF, mtp(3)], ids=["plain", "mtp"])
def test_a_sliding_window_keeping_its_window_only_goes_back_to_the_copy_at_the_prompts_end(spec, parallel):
    """A sliding-window target keeps only its window's cells (not ``swa_full``, as llama-server by default):
    a reply longer than the cache's slack beyond the window overwrites the cells the prompt's end needs, so a
    regenerated reply goes back to the copy of the window taken at the prompt's end (checkpoints.py) instead
    of prefilling again. Output and drafts: those of the same replies with every cell kept, where the
    rejected drafts are cut from a full-size cache (here they are cut from a window-sized one)."""
    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    prompt, long = FIRST * 6, 300  # with n_batch 64 the windowed cache has 256 cells: the reply wraps it

    def replies(swa_full: bool) -> tuple[list[object], list[bool]]:
        with Session(LoadOptions(path=path, n_ctx=1024, n_batch=64, parallel=parallel,
                                 swa_full=swa_full)) as session:
            engine = ParallelGenerator(session) if parallel > 1 else None
            out, could_cut = [], []
            for _ in range(3):
                if engine is None:
                    out.append(run(session, spec, prompt=prompt, max_tokens=long, record_drafts=True))
                else:
                    job = Job(GenerateRequest(prompt=prompt, max_tokens=long, speculative=spec, record_drafts=True))
                    engine.add(job)
                    while not engine.idle:
                        engine.step()
                    out.append(job.result)
                seq = 0 if engine is None else job.seq
                could_cut.append(session.target.keeps_window(out[0].stats.prompt_tokens - 1, seq))
            return out, could_cut

    (first, *again), could_cut = replies(swa_full=False)
    assert not any(could_cut)  # the cells before the window at the prompt's end are gone after each reply
    assert [r.stats.prompt_reused for r in again] == [first.stats.prompt_tokens - 1] * 2
    assert len(first.tokens) == long
    (full, *_), could_cut = replies(swa_full=True)
    assert all(could_cut)
    for r in again:
        assert r.tokens == first.tokens and r.drafts_per_round == first.drafts_per_round
    assert first.tokens == full.tokens and first.drafts_per_round == full.drafts_per_round


def test_a_window_copy_with_no_host_memory_for_it_costs_only_the_prefill_it_would_have_saved(monkeypatch):
    """The copy of the window at a prompt's end is a host buffer; where there is no memory for it (a
    MemoryError, which this machine cannot be made to raise for real), the reply goes on, and a regenerated
    reply prefills its prompt again, with the same tokens."""
    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    prompt = FIRST * 6
    with Session(LoadOptions(path=path, n_ctx=1024, n_batch=64)) as session:
        real = session.target.state_save

        def no_memory(*args: object, **kwargs: object) -> object:
            raise MemoryError

        monkeypatch.setattr(session.target, "state_save", no_memory)
        first = run(session, SPECULATION_OFF, prompt=prompt, max_tokens=300)
        assert session.prefix.checkpoints.latest is None or session.prefix.checkpoints.latest.state is None
        monkeypatch.setattr(session.target, "state_save", real)
        again = run(session, SPECULATION_OFF, prompt=prompt, max_tokens=300)
    assert again.tokens == first.tokens and len(first.tokens) == 300
    assert again.stats.prompt_reused == 0


def test_the_n_gram_drafter_reuses_the_prefix():
    session = Session(LoadOptions(path=str(synth("glm4moe", "mixed", seed=2).path()), n_ctx=512))
    try:
        reused = conversation(session, ngram(4))
        assert reused["continue"] > 0 and reused["regenerate"] == reused["regenerate of"] - 1
    finally:
        session.close()


MTP_CASES = [
    pytest.param("glm4moe", "combined", True, id="looped-folded"),
    pytest.param("glm4moe", "combined", False, id="looped-unfolded"),
    pytest.param("step35", "combined", True, id="chained-heads"),
    pytest.param("qwen35", "combined", True, id="hybrid-rs-rollback"),
    pytest.param("qwen3next", "sidecar", True, id="hybrid-sidecar"),
]


@pytest.mark.parametrize("arch, layout, fold", MTP_CASES)
def test_mtp_reuses_both_contexts_with_the_same_drafts(arch, layout, fold):
    model = synth(arch, "random", seed=5)  # every weight random: the head reads the hidden state
    path = model.path("trunk" if layout == "sidecar" else layout)
    sidecar = str(model.path("sidecar")) if layout == "sidecar" else None
    session = Session(LoadOptions(path=str(path), sidecar=sidecar, n_ctx=512, fold=fold))
    try:
        assert session.mtp_drafter is not None
        reused = conversation(session, mtp(3))
        assert reused["continue"] > 0 and reused["regenerate"] > 0
        if not session.is_hybrid:
            assert reused["regenerate"] == reused["regenerate of"] - 1
        # plain decoding in between leaves the MTP context behind: the next MTP reply keeps only what it follows
        run(session, prompt=FIRST + " more text")
        after = run(session, mtp(3), prompt=FIRST + " more text", record_drafts=True)
        same(session, after, fresh(session, FIRST + " more text", mtp(3)))
    finally:
        session.close()


QUOTE = ("The committee approved the new budget for the city library on Tuesday. "
         "The committee approved the new budget for the city library on Tuesday. The committee")


@pytest.mark.parametrize("arch, weights, seed", [("glm4moe", "random", 2), ("step35", "random", 3),
                                                 ("qwen35", "mixed", 4)])
def test_mtp_and_ngram_together_reuse_both_contexts_with_the_same_drafts(arch, weights, seed):
    """The composition's MTP half keeps its rows as MTP alone does (it deferred them through n-gram rounds
    and settles them as the reply ends); its n-gram half reads the reused tokens. Both contexts started
    empty before, and a conversation under MTP + n-gram prefilled every turn from the start. (Heads that
    read the hidden state; seeds whose continued reply drafts from both sources.)"""
    spec = ngram(3, mtp_too=True)
    path = synth(arch, weights, agree=0.7, reads="hidden", seed=seed).path("combined")
    session = Session(LoadOptions(path=str(path), n_ctx=512))
    try:
        first = reply(session, spec, prompt=QUOTE)
        follow = QUOTE + first.text + " and then"
        got = reply(session, spec, prompt=follow, record_drafts=True)
        assert got.stats.prompt_reused > 0 and got.stats.drafted_by_source.get("ngram", 0) > 0
        assert got.stats.drafted_by_source.get("mtp", 0) > 0
        same(session, got, fresh(session, follow, spec))
        reused = conversation(session, spec, QUOTE, QUOTE.replace("budget", "BUDGET", 1))
        assert reused["continue"] > 0 and reused["regenerate"] > 0
        if not session.is_hybrid:
            assert reused["regenerate"] == reused["regenerate of"] - 1
        if not (session.is_hybrid or session.model.n_swa):  # (a parting inside them starts over)
            assert reused["edit"] > 0
        assert session.prefix.mtp_tokens == session.prefix.tokens  # the head holds every row the target kept
    finally:
        session.close()


def test_mtp_and_ngram_with_adaptive_depth_keep_every_row_too():
    """Adaptive depth makes MTP alone catch up lazily (it starts over from a prompt's newest rows); the
    composition's MTP half never does, at any depth, so its rows are reused and the head ends a reply
    holding every row the target kept."""
    spec = SpeculativeSettings(MTP_NGRAM, 3, depth="adaptive")
    session = Session(LoadOptions(path=str(synth("glm4moe", "random", seed=2).path("combined")), n_ctx=512))
    try:
        reused = conversation(session, spec, QUOTE, QUOTE.replace("budget", "BUDGET", 1))
        assert reused["continue"] > 0 and reused["edit"] > 0
        assert reused["regenerate"] == reused["regenerate of"] - 1  # the MTP context one row ahead: all of it
        assert session.prefix.mtp_tokens == session.prefix.tokens
        # plain decoding in between leaves the MTP context behind: the target keeps only what the head follows
        more = QUOTE + " more text"
        run(session, prompt=more)
        after = reply(session, spec, prompt=more)
        assert 0 < after.stats.prompt_reused < after.stats.prompt_tokens - 1
        assert session.prefix.mtp_tokens == session.prefix.tokens
        same(session, after, fresh(session, more, spec), drafts=False)
    finally:
        session.close()


def test_plain_decoding_reuses_what_an_mtp_generation_left():
    session = Session(LoadOptions(path=str(synth("glm4moe", "mixed", seed=2).path()), n_ctx=512))
    try:
        run(session, mtp(3), prompt=FIRST)
        after = run(session, prompt=FIRST)  # an MTP generation leaves the target holding exactly what it kept
        assert after.stats.prompt_reused == after.stats.prompt_tokens - 1
        same(session, after, fresh(session, FIRST))
    finally:
        session.close()


def test_the_built_in_model_prefills_only_what_is_new(default_model):
    session = Session(LoadOptions(path=str(default_model), n_ctx=1024))
    try:
        reused = conversation(session)
        assert reused["continue"] > 0 and reused["regenerate"] > 0 and reused["edit"] > 0
        prompt = FIRST * 8
        cold = run(session, prompt=prompt)
        warm = run(session, prompt=prompt)
        assert warm.stats.prompt_reused == warm.stats.prompt_tokens - 1
        assert warm.tokens == cold.tokens
    finally:
        session.close()


def test_another_use_of_the_context_is_never_mistaken_for_the_last_generation():
    session = Session(LoadOptions(path=str(synth("glm4moe", "random", seed=4).path()), n_ctx=512))
    try:
        run(session, prompt=FIRST)
        identity.measure_noise(session)  # decodes on the target and clears it
        assert run(session, prompt=FIRST).stats.prompt_reused == 0
    finally:
        session.close()


def test_an_mtp_reply_leaves_the_head_holding_every_row_the_target_kept():
    """The catch-up of a reply's last rounds is deferred (folded into a next draft, or a plain step's) and
    decoded when the reply ends, so the next prompt reuses all of it. Left deferred, the MTP context held
    fewer rows than the target, and the next turn read the reply's tail again on both contexts. (Adaptive
    depth's lazy head does so only when it was drafting as the reply ended: tests/engine/test_lazy_catch_up.py.)"""
    spec = mtp(3)
    session = Session(LoadOptions(path=str(synth("glm4moe", "random", seed=5).path()), n_ctx=512))
    try:
        run(session, spec, prompt=FIRST)
        assert session.prefix.tokens and session.prefix.mtp_tokens == session.prefix.tokens
        with Session(LoadOptions(path=str(synth("glm4moe", "random", seed=5).path()), n_ctx=512,
                                 parallel=2)) as together:  # each sequence of a multi-sequence session too
            engine = ParallelGenerator(together)
            for prompt, n in ((FIRST, 24), (OTHER, 16)):
                engine.add(Job(GenerateRequest(prompt=prompt, max_tokens=n, speculative=spec)))
            while not engine.idle:
                engine.step()
            for memory in engine.sequences.memory:
                assert memory.held and memory.mtp_held == memory.held
    finally:
        session.close()

"""Going back to a conversation the contexts let go of: its state comes back from host memory
(engine/generation/state_cache.py).

A conversation, another one that cuts it, then the first continued: with the cache the
continuation reuses what the first conversation held (its state was saved when the other cut it
and restored when it came back); without it, the continuation prefills from the start. The output
is the output without the cache (judged as prefix reuse is: tests/engine/test_prefix_reuse.py),
drafts compared round by round on heads that read the hidden state (a wrong MTP row drafts
otherwise). One sequence (the single-sequence prefix cache) and two (the multi-sequence engine's).
"""

from __future__ import annotations

from functools import partial

import pytest

from engine.errors import ContextError
from engine.generation import identity, state_cache
from engine.generation.generator import GenerateRequest, GenerateResult
from engine.generation.load_plan import LoadPlan
from engine.generation.parallel import Job, ParallelGenerator
from engine.generation.session import LoadOptions, Session
from engine.generation.state_cache import MIN_TOKENS, SavedState, StateCache
from engine.load_options import check_options
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp, ngram
from tests.engine import conftest
from tests.engine.conftest import synth

TOKENS = 16
FIRST = " ".join(["the river model light and the mill by the water"] * 9)  # past MIN_TOKENS on any vocabulary
OTHER = " far away from here a town stood on the hill above the sea"
run = partial(conftest.run, max_tokens=TOKENS)

CASES = [
    pytest.param("glm4moe", SPECULATION_OFF, id="attention-plain"),
    pytest.param("glm4moe", mtp(3), id="attention-mtp"),
    pytest.param("qwen35", mtp(3), id="hybrid-mtp"),
    # the composition's MTP half keeps its rows as MTP alone does (engine/speculative/compose.py)
    pytest.param("glm4moe", ngram(3, mtp_too=True), id="attention-mtp-ngram"),
    # a sliding window of 16: llama.cpp saves the window's cells only, and the way back cuts the saved state
    # (the reply's text tokenizes otherwise here): it comes back to its window checkpoint at the first
    # prompt's end (before those, it did not come back; before that, it came back whole and drafted otherwise)
    pytest.param("step35", mtp(3), id="sliding-window-mtp"),
    pytest.param("step35", SPECULATION_OFF, id="sliding-window-plain"),
]


def same(session: Session, got: GenerateResult, baseline: GenerateResult) -> None:
    if got.tokens == baseline.tokens:
        assert got.drafts_per_round == baseline.drafts_per_round  # drafts, not only counts
        return
    verdict = identity.classify(baseline.tokens, baseline.margins, got.tokens, identity.measure_noise(session))
    assert verdict.acceptable, verdict.describe()


def switch_and_back(session: Session, spec: SpeculativeSettings) -> tuple[GenerateResult, GenerateResult]:
    """The first conversation, the other one, then the first continued; (the first reply, the continued one)."""
    first = run(session, spec, prompt=FIRST)
    run(session, spec, prompt=OTHER)
    back = run(session, spec, prompt=FIRST + first.text + " and then", record_drafts=True, record_margins=True)
    return first, back


THIRD = "Zero hour: a third story began in the library where the old clock had stopped"  # shares nothing


def together(session: Session, spec: SpeculativeSettings) -> tuple[GenerateResult, GenerateResult]:
    """:func:`switch_and_back` on a two-sequence engine, one request at a time, with a third conversation: a
    prompt that shares nothing takes the sequence used least recently (one never used first), so the other
    takes the free one, the third cuts the first, and the way back takes the other's sequence and gets the
    first one's state there."""
    engine = ParallelGenerator(session)
    seqs = []

    def one(prompt: str, **fields: object) -> GenerateResult:
        job = Job(GenerateRequest(prompt=prompt, max_tokens=TOKENS, speculative=spec, **fields))
        engine.add(job)
        seqs.append(job.seq)
        while not engine.idle:
            engine.step()
        assert job.result is not None
        return job.result

    first = one(FIRST)
    one(OTHER)
    one(THIRD)
    back = one(FIRST + first.text + " and then", record_drafts=True, record_margins=True)
    assert seqs == [0, 1, 0, 1]
    return first, back


@pytest.mark.parametrize("parallel", [1, 2], ids=["one-sequence", "two-sequences"])
@pytest.mark.parametrize("arch, spec", CASES)
def test_going_back_gets_the_conversation_another_cut_from_host_memory(arch, spec, parallel):
    path = str(synth(arch, "random", seed=5).path())  # every weight random: the head reads the hidden state
    way = switch_and_back if parallel == 1 else together
    with Session(LoadOptions(path=path, n_ctx=512, parallel=parallel, state_cache_mib=0)) as session:
        _, baseline = way(session, spec)
        assert baseline.stats.prompt_reused < 8  # without the cache: only what the other prompt shares
    with Session(LoadOptions(path=path, n_ctx=512, parallel=parallel)) as session:
        first, back = way(session, spec)
        assert session.states.saved >= 1  # (the other one is saved as it is cut too)
        assert session.states.restored == 1
        # everything the first conversation's prompt held (a hybrid, a sliding window: to its checkpoint before
        # the last token)
        assert back.stats.prompt_reused >= first.stats.prompt_tokens - 1 >= MIN_TOKENS
        same(session, back, baseline)


def _state(tokens: list[int], size: int) -> SavedState:
    return SavedState(tokens, bytearray(size), [])


def test_the_cache_drops_the_least_recently_used_within_its_budget_and_what_a_longer_state_holds():
    cache = StateCache(budget=3000)
    a, b = list(range(100)), list(range(1000, 1100))
    cache.add(_state(a, 1000))
    cache.add(_state(b, 1000))
    cache.add(_state(a + [7] * 50, 1000))  # a's conversation went on: the longer state holds the shorter one
    assert len(cache) == 2 and cache.used == 2000
    cache.add(_state(list(range(2000, 2100)), 1500))  # over the budget: b, the oldest, goes
    assert cache.take(b + [1], have=0) is None
    assert cache.take(a + [7] * 50 + [1], have=0) is not None and len(cache) == 1  # taken out
    cache.add(_state(list(range(3000, 3100)), 4000))  # larger than the whole budget: not kept
    assert len(cache) == 1
    assert not StateCache(budget=0).worth_saving(a, b)  # 0: nothing is kept
    assert not cache.worth_saving(a[:10], b)  # too short to be worth the memory
    assert not cache.worth_saving(a, a[:-5])  # too little of it is cut
    assert cache.worth_saving(a, b)


def test_a_state_longer_than_the_sliding_window_or_recurrent_comes_back_only_to_be_extended_or_to_its_checkpoint():
    cache = StateCache(budget=10_000, n_swa=16)
    long = list(range(100))
    cache.add(_state(long, 100))
    assert cache.take(long[:80] + [1], have=0) is None  # it would be cut back: its window's cells are not all saved
    assert cache.take(long + [1], have=0) is not None  # it goes on from its end
    for checked in (StateCache(budget=10_000, n_swa=16), StateCache(budget=10_000, recurrent=True)):
        checked.add(SavedState(long, bytearray(100), [], checkpoint=bytearray(10), checkpoint_pos=70))
        assert checked.take(long[:60] + [1], have=0) is None  # before its checkpoint: not at all
        assert checked.take(long[:80] + [1], have=0).checkpoint_pos == 70  # past it: back to it
    within = StateCache(budget=10_000, n_swa=128)
    within.add(_state(long, 100))  # shorter than the window: every cell was saved
    assert within.take(long[:80] + [1], have=0) is not None
    # nor does a longer state stand for a shorter one it begins with (it cannot be cut back to it): both kept
    for kept in (StateCache(budget=10_000, n_swa=16), StateCache(budget=10_000, recurrent=True)):
        kept.add(_state(long, 100))
        assert kept.worth_saving(long[:80], [5] * 80)
        kept.add(_state(long[:80], 100))
        assert len(kept) == 2
        kept.add(_state(long + [1, 2], 100))  # and a longer one replaces neither
        assert len(kept) == 3


def test_a_prompt_that_keeps_most_of_what_a_sequence_holds_does_not_save_it():
    """As llama-server saves a slot only where the prompt keeps less than half of it: a client's next request
    without the last reply, or a regenerated reply, cuts a short tail nobody comes back for, and the copy
    (of the whole state, while every other sequence waits) is not worth it. A long cut is, even where it is
    less than half (prefilling it again costs far more than the copy)."""
    cache = StateCache(budget=10**6)
    held = list(range(100))
    assert not cache.worth_saving(held, held[:60] + [7])  # 40 of 100 cut
    assert cache.worth_saving(held, held[:40] + [7])  # 60 of 100 cut: more than half
    long = list(range(3000))
    assert not cache.worth_saving(long, long[:2600] + [7])  # 400 of 3,000
    assert cache.worth_saving(long, long[:2400] + [7])  # 600 of 3,000: a long way to prefill again


def test_the_budget_is_checked_before_anything_loads():
    with pytest.raises(ContextError, match="--cache-ram"):
        check_options(LoadOptions(state_cache_mib=-1))


def test_the_budget_leaves_the_pages_of_the_model_files_alone():
    """The system counts a mapped model's pages as available memory; a cache that took them would have the
    model read from disk again as it decodes."""
    ask = 10**8  # MiB: more than a quarter of any machine's memory
    assert 0 < state_cache.budget(ask) < ask * 2**20
    assert state_cache.budget(ask, mapped=2**60) == 0  # files larger than the memory: no cache
    model = synth("qwen3next", "random", seed=5)
    plan = LoadPlan.read(LoadOptions(path=str(model.path("trunk")), sidecar=str(model.path("sidecar"))))
    assert plan.file_bytes == model.path("trunk").stat().st_size + model.path("sidecar").stat().st_size
    assert plan.device is None and plan.host_read_bytes() == plan.file_bytes  # no GPU here: the CPU reads all


def test_a_regenerated_sliding_window_reply_still_comes_back_to_its_checkpoint_after_a_switch():
    """A regenerated reply cuts the last one, whose state is saved: with its window checkpoint (the prompt
    keeps all but its last token, which is the checkpoint), else that copy, standing for the same tokens,
    kept the one saved when another conversation cut it from being saved, and a regenerate after the switch
    prefilled everything."""
    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    with Session(LoadOptions(path=path, n_ctx=512)) as session:
        first = run(session, SPECULATION_OFF, prompt=FIRST, max_tokens=48)
        run(session, SPECULATION_OFF, prompt=FIRST, max_tokens=48)  # regenerated (the same greedy reply)
        run(session, SPECULATION_OFF, prompt=OTHER, max_tokens=48)  # another conversation
        back = run(session, SPECULATION_OFF, prompt=FIRST, max_tokens=48)  # regenerated after the switch
        assert back.stats.prompt_reused == first.stats.prompt_tokens - 1
        assert back.tokens == first.tokens


def _decode(target: object, part: list[int], start: int) -> list[float]:
    """Decode ``part`` at ``start`` in one batch; the first 64 logits of its last row."""
    from engine.runtime import Batch

    batch = Batch(target.n_batch)
    for k, token in enumerate(part):
        batch.add(token, start + k, k == len(part) - 1)
    target.decode(batch)
    return list(target.logits(len(part) - 1)[:64])


def test_a_sliding_window_state_from_host_memory_is_never_cut_back_where_its_window_is_missing():
    """llama.cpp saves a sliding-window cache's cells within the window only. Whatever brings such a state back
    (a later MTP turn's lane limit cut it below its end where take() had allowed it whole), the prefix cache
    cuts it back only where the window's cells are there (llama-server's check); else it prefills again, and
    the next logits are a fresh prefill's."""
    from engine.generation.prefix_cache import PrefixCache
    from engine.generation.state_cache import restore, save

    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    with Session(LoadOptions(path=path, n_ctx=512, state_cache_mib=0)) as session:
        target = session.target
        tokens = session.model.tokenize(FIRST, add_special=True, parse_special=True)[:130]

        target.clear()
        decode = partial(_decode, target)
        decode(tokens, 0)
        kept = save(target, 0, tokens)
        target.clear()
        fresh = decode(tokens[:101], 0)
        restore(kept, target, 0)
        assert target.keeps_window(len(tokens)) and not target.keeps_window(100)
        prefix = PrefixCache()
        prefix.took_up(target, tokens, None, [], None, 0)
        assert prefix.start(target, tokens[:101], hybrid=False) == 0  # not cut back: prefilled again
        assert decode(tokens[:101], 0) == fresh


def test_a_sliding_window_state_gets_its_checkpoint_only_where_the_cut_loses_nothing():
    """Saving a sliding-window state longer than the window also cuts the sequence back to the last prompt's
    end and copies the window's cells there (state_cache.window_checkpoint). Only where the prompt that cuts
    the sequence keeps no more than that: one keeping part of the reply keeps all it shares."""
    from engine.generation.checkpoints import Checkpoint
    from engine.generation.prefix_cache import PrefixCache
    from engine.generation.state_cache import keep, restore

    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    with Session(LoadOptions(path=path, n_ctx=512, state_cache_mib=0)) as session:
        target, states = session.target, StateCache(budget=2**30, n_swa=session.model.n_swa)
        tokens = session.model.tokenize(FIRST, add_special=True, parse_special=True)[:150]
        end = 100  # the last prompt's all but last token; the rest, its last token and the reply

        decode = partial(_decode, target)
        target.clear()
        decode(tokens, 0)
        part_of_reply = tokens[:120] + [7] * 40  # keeps 120: more than the checkpoint's 100
        assert keep(states, target, 0, tokens, None, [], Checkpoint(end, None), part_of_reply) == len(tokens)
        assert target.seq_pos_max() == len(tokens) - 1 and states.take(tokens[:110] + [7], have=0) is None
        other = [7] * 40  # keeps nothing
        assert keep(states, target, 0, tokens, None, [], Checkpoint(end, None), other) == end
        assert target.seq_pos_max() == end - 1  # cut back to the checkpoint
        target.clear()
        decode(tokens[:end], 0)
        fresh = decode(tokens[end:end + 5], end)  # the way a regenerated reply goes on from the checkpoint
        target.clear()
        saved = states.take(tokens[:end + 5], have=0)
        assert saved is not None and saved.checkpoint_pos == end
        restore(saved, target, 0)
        prefix = PrefixCache()
        prefix.took_up(target, saved.tokens, None, [], saved.checkpoint, saved.checkpoint_pos)
        assert prefix.start(target, tokens[:end + 5], hybrid=False) == end  # back to the checkpoint
        assert decode(tokens[end:end + 5], end) == fresh


def test_a_budget_for_one_state_still_brings_the_conversation_back():
    """The state coming back is taken out before the one it replaces is saved: saving first pushed it out
    (two conversations each over half the budget never came back)."""
    path = str(synth("glm4moe", "random", seed=5).path())
    with Session(LoadOptions(path=path, n_ctx=512)) as session:
        first = run(session, SPECULATION_OFF, prompt=FIRST)
        run(session, SPECULATION_OFF, prompt=OTHER + " " + FIRST[::-1])  # long enough to be saved in its turn
        assert len(session.states) == 1
        session.states.budget = session.states.used * 3 // 2  # room for one state only
        back = run(session, SPECULATION_OFF, prompt=FIRST + first.text + " and then")
        assert session.states.restored == 1 and back.stats.prompt_reused >= first.stats.prompt_tokens - 1
        assert len(session.states) == 1  # the other conversation, kept in its place


def test_a_state_comes_back_only_for_what_the_caller_keeps_of_it():
    mtp_short = SavedState(list(range(200)), bytearray(10), list(range(40)))  # its MTP lane held 40 rows
    cache = StateCache(budget=10_000)
    cache.add(mtp_short)
    prompt = list(range(200)) + [7]
    assert cache.take(prompt, have=0, follows_mtp=True) is not None  # 39 rows: more than MIN_GAIN
    cache.add(SavedState(list(range(200)), bytearray(10), list(range(20))))
    assert cache.take(prompt, have=0, follows_mtp=True) is None  # 19: a fixed depth would keep too little
    assert cache.take(prompt, have=0) is not None  # plain decoding keeps all of it
    hybrid = StateCache(budget=10_000, recurrent=True)
    hybrid.add(SavedState(list(range(200)), bytearray(10), [], checkpoint=bytearray(4), checkpoint_pos=150))
    assert hybrid.take(list(range(120)) + [7], have=0) is None  # cut before its checkpoint: nothing kept
    assert hybrid.take(list(range(160)) + [7], have=0) is not None  # back to its checkpoint: 150 kept

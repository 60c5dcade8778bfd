"""Several generations at once on one multi-sequence session (engine/generation/parallel.py).

Each sequence's output — its tokens, and with MTP its drafts round by round — must be
exactly what the same request gives alone on a one-sequence session, on every
architecture, whatever the other sequences do: start later, end sooner, get cancelled.
The heads read the hidden state, so a sequence drafting from another's state would show.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from engine.generation import identity
from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.parallel import Job, ParallelGenerator, generate_together
from engine.generation.parallel import generate_alone as alone
from engine.generation.session import LoadOptions, Session
from engine.runtime import SamplingParams
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp, ngram
from tests.engine.conftest import ALL_MTP_ARCHS, heads_for, synth

PROMPTS = [" the river model", " a quiet light", " numbers and words", " the old bridge"]


def requests(spec: SpeculativeSettings, n: int = 4, **kw) -> list[GenerateRequest]:
    """Different prompts and lengths, so the sequences end at different steps."""
    return [GenerateRequest(prompt=PROMPTS[i % 4] + " x" * (i // 4), max_tokens=24 + 8 * i, speculative=spec,
                            record_drafts=True, **kw) for i in range(n)]


def keeps_mtp_rows(spec: SpeculativeSettings) -> bool:
    """A lane that keeps every MTP row (a fixed depth, or MTP + n-gram's MTP half at any depth): sharing or
    reusing cells, it resumes one row after them."""
    return spec.mode == "mtp+ngram" or (spec.mode == "mtp" and not spec.adaptive)


def same_as_alone(solo: GenerateResult, together: GenerateResult, noise: float) -> None:
    """The same tokens and, round by round, the same drafts. A prompt chunk decoded in one batch with
    other sequences' rows may flip a greedy choice whose top-2 margin is inside the batch-shape noise
    (identity.py): that alone is accepted, judged with the margins of the run alone."""
    if together.tokens != solo.tokens:
        verdict = identity.classify(solo.tokens, solo.margins, together.tokens, noise)
        assert verdict.acceptable, verdict.describe()
        return
    assert together.drafts_per_round == solo.drafts_per_round  # drafts, not only counts
    assert (together.stats.rounds, together.stats.accepted) == (solo.stats.rounds, solo.stats.accepted)
    assert together.finish_reason == solo.finish_reason


def run_all(engine: ParallelGenerator, jobs: list[Job]) -> None:
    """Add ``jobs`` together and step until every one has ended."""
    for job in jobs:
        engine.add(job)
    while not engine.idle:
        engine.step()


@pytest.mark.parametrize("arch", ALL_MTP_ARCHS)
@pytest.mark.parametrize("spec", [mtp(3), SPECULATION_OFF], ids=["mtp", "off"])
def test_each_of_four_sequences_is_what_it_would_be_alone(arch, spec):
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(spec)
    solo, noise = alone(path, reqs, 4)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4)) as session:
        assert session.mtp_drafter is not None or spec == SPECULATION_OFF, session.mtp_unavailable_reason
        together = generate_together(session, reqs, starts=[0, 0, 3, 7])  # two join while others run
    for s, t in zip(solo, together, strict=True):
        same_as_alone(s, t, noise)
    if spec.enabled:
        assert sum(t.stats.rounds for t in together) > 0


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35", "step35"])
@pytest.mark.parametrize("spec", [mtp(3), SPECULATION_OFF], ids=["mtp", "off"])
def test_with_a_pool_of_cells_per_sequence_each_is_what_it_would_be_alone(arch, spec):
    """``kv_unified=False`` (``serve --no-kv-unified``, as llama-server's --parallel N): each sequence's cells in
    a pool of its own, so a row attends over its own context only; a batch of uneven rows (sequences joining,
    drafting to different depths) splits into several graphs. Each reply and its drafts: what it is alone."""
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(spec)
    solo, noise = alone(path, reqs, 4, own_pool=True)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, kv_unified=False)) as session:
        assert not session.kv_unified
        together = generate_together(session, reqs, starts=[0, 0, 3, 7])  # two join while others run
    for s, t in zip(solo, together, strict=True):
        same_as_alone(s, t, noise)


@pytest.mark.parametrize("spec", [SPECULATION_OFF, mtp(3, depth="adaptive"), mtp(3)], ids=["off", "adaptive", "fixed"])
def test_with_a_pool_of_cells_per_sequence_requests_with_one_start_copy_it(spec):
    """Pools of their own cannot hold each other's cells: requests arriving together with one system prompt
    wait for the first to read it and take a copy of its pool cut back to that start (and a fixed depth's lane
    its head's rows the same way), then read only their own ends; each reply is what it is alone."""
    from engine.generation.prefix_cache import common_prefix

    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    system = " the river model" + " and the old bridge" * 12
    reqs = [GenerateRequest(prompt=system + tail, max_tokens=16, speculative=spec, record_drafts=True)
            for tail in (" first", " second", " third")]
    solo, noise = alone(path, reqs, 3, own_pool=True)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3, kv_unified=False)) as session:
        tokens = [session.model.tokenize(r.prompt) for r in reqs]
        jobs = [Job(r) for r in reqs]
        run_all(ParallelGenerator(session), jobs)
    common = [0] + [common_prefix(tokens[0], t) - keeps_mtp_rows(spec) for t in tokens[1:]]
    assert [j.result.stats.prompt_reused for j in jobs] == common and min(common[1:]) > 40
    for s, j in zip(solo, jobs, strict=True):
        if spec.adaptive:  # (its rounds follow its timings: the tokens are compared)
            assert j.result.tokens == s.tokens
        else:
            same_as_alone(s, j.result, noise)


@pytest.mark.parametrize("n_seq", [1, 2])
def test_one_or_two_sequences_and_more_requests_than_sequences(n_seq):
    # five requests through fewer sequences: each waits for a free one, and a sequence that
    # served one request serves the next from an empty start
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(mtp(3), n=5)
    solo, noise = alone(path, reqs, n_seq)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=n_seq)) as session:
        together = generate_together(session, reqs)
    for s, t in zip(solo, together, strict=True):
        same_as_alone(s, t, noise)


def test_seven_requests_joining_three_sequences_at_different_steps_are_each_what_they_are_alone():
    """A schedule that caught each step's verify rows put in sequence order in one shared pool: the rows then
    land elsewhere among the shared cells, and the last reply parted from its run alone at a near-tie of
    0.0009, beyond the fixed batch-shape noise allowed here (0.00013) though within the noise measured along
    its text (0.0018); another's drafts differed. One pool keeps arrival order (only pools of their own sort
    rows: docs/parallel.md, Known limits)."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(mtp(3), n=7)
    solo, noise = alone(path, reqs, 3)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        together = generate_together(session, reqs, starts=[0, 0, 2, 5, 9, 11, 14])
    for s, t in zip(solo, together, strict=True):
        same_as_alone(s, t, noise)


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_hybrid_sequences_joining_and_ending_while_others_draft_are_each_what_they_are_alone(arch):
    """A schedule where one sequence's verify rows go in a ubatch of their own and the next ubatch of the
    same decode, other sequences' rows, moves its recurrent cell out of their way: before
    packaging/patches/0009 its rollback then read another sequence's snapshot plane, and its reply parted
    from plain decoding far outside any noise."""
    hybrids_joining_and_ending(arch)


def hybrids_joining_and_ending(arch: str, n_gpu_layers: int = 0) -> None:
    """Eight requests on four sequences of a hybrid with fixed-depth MTP, each the same as alone (the GPU tier
    runs it with every layer on the device)."""
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(mtp(3), n=8)
    solo, noise = alone(path, reqs, 4, n_gpu_layers=n_gpu_layers)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, n_gpu_layers=n_gpu_layers)) as session:
        together = generate_together(session, reqs, starts=[0, 0, 1, 1, 5, 6, 7, 12])
    for s, t in zip(solo, together, strict=True):
        same_as_alone(s, t, noise)


@pytest.mark.parametrize("arch", ["glm4moe", "qwen35"])
def test_a_cancelled_sequence_stops_and_leaves_the_others_as_they_were(arch):
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(mtp(2), n=3)
    solo, noise = alone(path, reqs, 3)
    pieces: list[str] = []
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        engine = ParallelGenerator(session)
        jobs = [Job(reqs[0]), Job(reqs[1], on_text=lambda text, _draft: pieces.append(text),
                                  should_stop=lambda: len(pieces) >= 6), Job(reqs[2])]
        run_all(engine, jobs)
    cancelled = jobs[1].result
    assert cancelled is not None and cancelled.finish_reason == "cancelled"
    assert 6 <= len(cancelled.tokens) < len(solo[1].tokens)
    assert cancelled.tokens == solo[1].tokens[:len(cancelled.tokens)]
    for i in (0, 2):
        same_as_alone(solo[i], jobs[i].result, noise)


@pytest.mark.parametrize("spec", [mtp(3, depth="adaptive"), SpeculativeSettings("mtp+ngram", 4),
                                  SpeculativeSettings("ngram", 4)], ids=["adaptive", "mtp+ngram", "ngram"])
def test_adaptive_depth_and_ngram_drafting_keep_each_sequence_greedy_output(spec):
    # which rounds draft depends on timings (adaptive) and on each sequence's own n-gram map:
    # the tokens must still be each request's own
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    reqs = requests(spec, n=3)
    solo, noise = alone(path, reqs, 3)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        together = generate_together(session, reqs, starts=[0, 2, 4])
    assert [t.tokens for t in together] == [s.tokens for s in solo]
    assert all(t.stats.settings == spec for t in together)


def test_seeded_sampling_per_sequence_is_its_own():
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    sampling = [SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.0, seed=seed) for seed in (1, 2, 3)]
    reqs = [GenerateRequest(prompt=PROMPTS[0], max_tokens=32, speculative=mtp(3), sampling=s) for s in sampling]
    solo, noise = alone(path, reqs, 3)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        together = generate_together(session, reqs)
    assert [t.tokens for t in together] == [s.tokens for s in solo]
    assert len({tuple(s.tokens) for s in solo}) > 1  # the seeds differ, so do the replies


def test_a_prompt_too_long_for_its_sequence_fails_alone():
    path = str(synth("glm4moe", "mixed", agree=0.7).path())
    with Session(LoadOptions(path=path, n_ctx=256, parallel=2)) as session:
        engine = ParallelGenerator(session)
        ok, too_long = Job(requests(mtp(2), n=1)[0]), Job(GenerateRequest(prompt=" word" * 400, max_tokens=8))
        engine.add(too_long)
        engine.add(ok)
        assert too_long.done and "holds" in str(too_long.error) and engine.has_room  # its sequence is free again
        while not engine.idle:
            engine.step()
    assert ok.result is not None and ok.result.tokens


@pytest.mark.parametrize("arch", ["glm4moe", "step35", "qwen35", "mimo2", "deepseek2"])
def test_a_continued_conversation_decodes_only_its_new_turn_on_the_sequence_that_holds_it(arch):
    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    first = requests(mtp(3), n=2)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=2)) as session:
        engine = ParallelGenerator(session)
        turn1 = [Job(r) for r in first]
        run_all(engine, turn1)
        # the second conversation goes on; a third, new one arrives beside it
        follow = GenerateRequest(prompt=first[1].prompt + turn1[1].result.text + " and then", max_tokens=24,
                                 speculative=mtp(3), record_drafts=True)
        turn2 = [Job(follow), Job(GenerateRequest(prompt=" the last word", max_tokens=16, speculative=mtp(3),
                                                  record_drafts=True))]
        run_all(engine, turn2)
    assert turn2[0].seq == turn1[1].seq  # it went back to the sequence holding its start
    # it reused as much as one sequence alone reuses for the same two turns (the prefix cache)
    with Session(LoadOptions(path=path, n_ctx=1024)) as session:
        generate(session, first[1])
        reused_alone = generate(session, follow).stats.prompt_reused
    assert turn2[0].result.stats.prompt_reused == reused_alone > 0
    solo, noise = alone(path, [follow, turn2[1].request], 2)
    same_as_alone(solo[0], turn2[0].result, noise)
    same_as_alone(solo[1], turn2[1].result, noise)


@pytest.mark.parametrize("arch", ["glm4moe", "deepseek2"])
@pytest.mark.parametrize("spec, first_spec", [(SPECULATION_OFF, None), (mtp(3, depth="adaptive"), None),
                                              (mtp(3), None), (mtp(3), ngram(3, mtp_too=True)), (ngram(4), None),
                                              (ngram(3, mtp_too=True), None)],
                         ids=["off", "adaptive", "fixed", "fixed-after-mtp-ngram", "ngram", "mtp-ngram"])
def test_a_request_shares_the_start_another_sequence_holds(arch, spec, first_spec):
    """Requests with one long system prompt arriving while the first runs: each, on a sequence of its own,
    shares the cells the running ones hold instead of decoding the prompt again, and each reply is what it
    is alone. A lane that keeps every MTP row (a fixed depth) shares the head's rows too and resumes one row
    after the shared cells; the first may draft with MTP + n-gram, whose MTP half keeps every row as well.
    An n-gram map reads the shared tokens (its drafts are then those of the prompt read whole)."""
    from engine.generation.prefix_cache import common_prefix

    path = str(synth(arch, "mixed", agree=0.7, reads="hidden").path())
    system = " the river model" + " and the old bridge" * 12
    first, second, third = (GenerateRequest(prompt=system + tail, max_tokens=20, speculative=spec,
                                            record_drafts=True) for tail in (" first", " second", " third"))
    first = replace(first, speculative=first_spec or spec)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        tokens = [session.model.tokenize(r.prompt) for r in (first, second, third)]
        engine = ParallelGenerator(session)
        jobs = [Job(first)]
        engine.add(jobs[0])
        engine.step()
        engine.step()
        for request in (second, third):  # each joins while the ones before it run
            jobs.append(Job(request))
            engine.add(jobs[-1])
            engine.step()
        while not engine.idle:
            engine.step()
    assert [j.seq for j in jobs] == [0, 1, 2]
    keeps_rows = keeps_mtp_rows(spec)  # it resumes one row after the shared cells
    for j, own in zip(jobs[1:], tokens[1:], strict=True):
        expected = min(common_prefix(tokens[0], own), len(own) - 1) - keeps_rows
        assert j.result.stats.prompt_reused == expected > 40
        if spec.uses_ngram:  # its map read the shared tokens: what it drafts from begins with its whole prompt
            assert list(engine.sequences.memory[j.seq].drafters.ngram.context[:len(own)]) == own
    solo, noise = alone(path, [first, second, third], 3)
    for s, j in zip(solo, jobs, strict=True):
        if spec.adaptive:  # which rounds draft depends on timings: the tokens must still be its own
            assert j.result.tokens == s.tokens
        else:
            same_as_alone(s, j.result, noise)


@pytest.mark.parametrize("kv_unified", [True, False], ids=["one-pool", "pool-each"])
@pytest.mark.parametrize("swa_full", [False, True], ids=["window", "full"])
def test_two_requests_with_one_long_prompt_on_a_window_only_cache_each_read_it(swa_full, kv_unified):
    """A sliding-window target keeping its window's cells only has the window of each sequence and a ubatch
    (256 cells here), and llama.cpp takes a cell back only while one sequence holds it: had the second request
    shared the first's prompt cells in one pool, neither could go on (llama_decode found no cell for either).
    So there each reads its own prompt, and each reply is what it is alone; keeping every cell, the second
    shares; in pools of their own it takes a copy, whose cells are its alone, window-only or not."""
    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    prompt = " the river model and the old bridge" * 14
    reqs = [GenerateRequest(prompt=prompt + tail, max_tokens=40, speculative=mtp(3), record_drafts=True)
            for tail in (" first", " second")]
    options = LoadOptions(path=path, n_ctx=1024, n_batch=64, parallel=2, swa_full=swa_full, kv_unified=kv_unified)
    with Session(options) as session:
        assert session.window_cache is not swa_full
        engine = ParallelGenerator(session)
        jobs = [Job(r) for r in reqs]
        engine.add(jobs[0])
        for _ in range(6):  # the first has read most of its prompt
            engine.step()
        engine.add(jobs[1])
        while not engine.idle:
            engine.step()
    assert [j.error for j in jobs] == [None, None]
    with Session(replace(options, parallel=1)) as session:
        solo = [generate(session, r) for r in reqs]
    for s, j in zip(solo, jobs, strict=True):
        assert (j.result.tokens, j.result.drafts_per_round) == (s.tokens, s.drafts_per_round)
    reused = jobs[1].result.stats.prompt_reused
    assert reused > 300 if swa_full or not kv_unified else reused == 0


def test_a_request_shares_no_start_a_state_from_host_memory_does_not_hold():
    """Keeping every cell (``swa_full``), a sliding-window sequence brought back from host memory holds only
    its window's cells (engine/generation/state_cache.py): a request whose prompt shares an earlier start of
    it reads that itself instead of sharing cells that are not there (its attention would miss them). (The
    check at admission, Sequences._share; a request waiting for a prompt being read makes the same check,
    which only a lagging MTP lane could reach.)"""
    path = str(synth("step35", "random", seed=5).path())  # a window of 16
    start = " the river model and the old bridge" * 8
    first = GenerateRequest(prompt=start + " first", max_tokens=24)
    options = LoadOptions(path=path, n_ctx=1024, n_batch=64, parallel=2, swa_full=True)
    with Session(options) as session:
        engine = ParallelGenerator(session)
        done = [Job(first), Job(GenerateRequest(prompt=" numbers and words" * 20, max_tokens=48))]
        run_all(engine, done)
        # another prompt takes the sequence that ended first: the first conversation goes to host memory
        run_all(engine, [Job(GenerateRequest(prompt="Zero hour: the clock had stopped" * 8, max_tokens=8))])
        # its continuation brings it back, as its window's cells, into the other sequence, and goes on replying
        going_on = Job(GenerateRequest(prompt=first.prompt + done[0].result.text + " and then", max_tokens=120))
        engine.add(going_on)
        for _ in range(3):
            engine.step()
        # its first half: none of the cells a window there needs came back
        later = Job(GenerateRequest(prompt=" the river model and the old bridge" * 4 + " second", max_tokens=24))
        engine.add(later)
        while not engine.idle:
            engine.step()
    assert going_on.result.stats.prompt_reused > len(done[0].result.tokens)  # it came back from host memory
    with Session(replace(options, parallel=1)) as session:
        assert later.error is None and later.result.tokens == generate(session, later.request).tokens
    assert later.result.stats.prompt_reused == 0


@pytest.mark.parametrize("spec", [SPECULATION_OFF, mtp(3, depth="adaptive"), mtp(3)], ids=["off", "adaptive", "fixed"])
def test_requests_arriving_together_with_one_system_prompt_read_it_once(spec, monkeypatch):
    """Three requests sent at once with one long system prompt: the first reads it, the others wait for
    that and share its cells (and a fixed depth's lane its head's rows), then read only their own ends;
    each reply is what it is alone. Cancel the one they wait for and they read their prompts themselves."""
    from engine.generation.prefix_cache import common_prefix

    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    system = " the river model" + " and the old bridge" * 12
    reqs = [GenerateRequest(prompt=system + tail, max_tokens=16, speculative=spec, record_drafts=True)
            for tail in (" first", " second", " third")]
    keeps_rows = keeps_mtp_rows(spec)  # it resumes one row after the shared cells
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        tokens = [session.model.tokenize(r.prompt) for r in reqs]
        rows: list[int] = []
        decode = session.target.decode
        monkeypatch.setattr(session.target, "decode", lambda batch: (rows.append(batch.n), decode(batch))[1])
        engine = ParallelGenerator(session)
        jobs = [Job(r) for r in reqs]
        run_all(engine, jobs)
        prompt_rows = rows[0] + rows[1]  # the first prompt; then the others' ends beside its first token
        stop: list[bool] = []
        again = [Job(reqs[0], should_stop=lambda: bool(stop)), Job(reqs[1])]
        engine = ParallelGenerator(session)  # remembering nothing: every prompt read from its start
        for job in again:
            engine.add(job)
        stop.append(True)  # the one it waits for is cancelled before it reads: it reads its prompt itself
        while not engine.idle:
            engine.step()
    common = [0] + [common_prefix(tokens[0], t) - keeps_rows for t in tokens[1:]]
    assert [j.result.stats.prompt_reused for j in jobs] == common and min(common[1:]) > 40
    ends = sum(len(t) - c for t, c in zip(tokens[1:], common[1:], strict=True))
    # the first's first round beside them: its token, and its drafts (up to 3)
    assert len(tokens[0]) + ends + 1 <= prompt_rows <= len(tokens[0]) + ends + 1 + 3
    assert again[0].result.finish_reason == "cancelled" and again[1].result.stats.prompt_reused == 0
    solo, noise = alone(path, reqs, 3)
    for s, j in zip(solo, [*jobs, again[1]], strict=False):
        if spec.adaptive:  # which rounds draft depends on timings: the tokens must still be its own
            assert j.result.tokens == s.tokens
        else:
            same_as_alone(s, j.result, noise)


def test_the_sequences_draft_steps_are_decoded_together(monkeypatch):
    # four sequences drafting in step: one decode of the draft context per draft step for all of them,
    # not one per sequence (llama-server's slots draft in one batch too)
    path = str(synth("glm4moe", "oracle", agree=1.0).path())
    reqs = [GenerateRequest(prompt=p, max_tokens=40, speculative=mtp(3)) for p in PROMPTS]

    def mtp_decodes(n_seq: int, together: bool) -> tuple[int, list[list[int]]]:
        with Session(LoadOptions(path=path, n_ctx=512, parallel=n_seq)) as session:
            ctx, calls = session.mtp_drafter.ctx, [0]
            decode = ctx.decode

            def counting(batch):
                calls[0] += 1
                decode(batch)

            monkeypatch.setattr(ctx, "decode", counting)
            if together:
                tokens = [r.tokens for r in generate_together(session, reqs)]
            else:
                tokens = [generate(session, r).tokens for r in reqs]
            monkeypatch.undo()
            return calls[0], tokens

    alone, alone_tokens = mtp_decodes(1, together=False)
    together, together_tokens = mtp_decodes(4, together=True)
    assert together_tokens == alone_tokens
    assert together < 0.5 * alone, (together, alone)


def test_the_batch_learns_a_shared_draft_step_once_and_not_from_prompt_chunks(monkeypatch):
    """The cost model adaptive depth chooses a batch's depths with (adaptive/batch.py): one draft step
    per shared decode of the draft context, however many sequences drafted in it (counted once per
    sequence, drafting looked N times dearer and adaptive stopped drafting where a fixed depth gained),
    and no verify timing from a decode that also carried a newcomer's prompt chunk."""
    path = str(synth("glm4moe", "oracle", agree=1.0).path())
    reqs = [GenerateRequest(prompt=p, max_tokens=24, speculative=mtp(3)) for p in PROMPTS]
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4)) as session:
        engine = ParallelGenerator(session)
        seen: list[tuple[int, int]] = []
        observe = engine.batch_costs.observe
        monkeypatch.setattr(engine.batch_costs, "observe",
                            lambda rows, steps, *times: (seen.append((rows + 1, steps)), observe(rows, steps, *times)))
        draft_decodes = count_draft_decodes(session.mtp_drafter.ctx, monkeypatch)
        jobs = [Job(r) for r in reqs]
        for job in jobs[:3]:
            engine.add(job)
        while any(not r.prefilled for r in engine.running):
            engine.step()
        engine.add(jobs[3])  # joins later: its prompt chunks ride in the verify decodes
        chunk_steps = 0
        while not engine.idle:
            chunk_steps += any(not r.prefilled for r in engine.running)
            engine.step()
    assert all(job.result is not None for job in jobs)
    assert chunk_steps >= 1
    # every drafting step drafted 3 deep in every sequence (every draft accepted): three shared steps
    drafting = [(rows, steps) for rows, steps in seen if steps]
    assert drafting and all(steps <= 3 for _, steps in drafting), seen
    assert any(rows >= 3 * 4 for rows, _ in drafting)  # three sequences' four rows each, at least
    assert sum(steps for _, steps in seen) <= draft_decodes[0]
    # a step counted is one without a prompt chunk: never more rows than the running sequences verify
    assert all(rows <= 4 * (3 + 1) for rows, _ in seen)


def test_requests_arriving_together_read_their_prompts_in_one_decode(monkeypatch):
    """Four requests that arrive together all read their (short) prompts in the first target decode and
    have their first token after it, as llama-server's slots do; one prompt per step made the fourth
    wait three steps for its first token."""
    path = str(synth("glm4moe", "oracle", agree=1.0).path())
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4)) as session:
        engine = ParallelGenerator(session)
        decodes = count_decodes(session.target, monkeypatch)
        jobs = [Job(GenerateRequest(prompt=p, max_tokens=8, speculative=mtp(3))) for p in PROMPTS]
        for job in jobs:
            engine.add(job)
        engine.step()
        assert decodes[0] == 1
        assert all(r.prefilled and len(r.decoder.out.tokens) == 1 for r in engine.running)
        while not engine.idle:
            engine.step()
    assert [len(job.result.tokens) for job in jobs] == [8] * 4


@pytest.mark.parametrize("parallel", [1, 4], ids=["alone", "together"])
def test_a_first_token_goes_out_before_the_head_catches_up_on_the_prompt(parallel, monkeypatch):
    """With a fixed depth the MTP lane catches up on every prompt row, a decode of the head: the first token
    no longer waits for it (a client's time to first token), here or in four sequences read together,
    and the reply and its drafts are what they were."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())  # a head reading the hidden state
    reqs = requests(mtp(3), n=parallel)
    solo, noise = alone(path, reqs, parallel)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=parallel)) as session:
        head_decodes = count_decodes(session.mtp_drafter.ctx, monkeypatch)
        at_first: list[list[int]] = [[] for _ in reqs]

        def first(i: int):
            return lambda text, draft: at_first[i].append(head_decodes[0])

        if parallel == 1:
            results = [generate(session, reqs[0], on_text=first(0))]
        else:
            engine, jobs = ParallelGenerator(session), [Job(r, on_text=first(i)) for i, r in enumerate(reqs)]
            run_all(engine, jobs)
            results = [job.result for job in jobs]
        assert [texts[0] for texts in at_first] == [0] * parallel  # no decode of the head before any first token
        assert head_decodes[0] > 0
    for s, result in zip(solo, results, strict=True):
        same_as_alone(s, result, noise)


def reversed_second_wave(session: Session, spec: SpeculativeSettings) -> tuple[ParallelGenerator, list[Job]]:
    """Four conversations, then each continued in reverse order: each goes back to the sequence that holds
    it, so the running sequences are 3, 2, 1, 0 in arrival order. The engine after the first step of the
    second wave (each has read its new token)."""
    reqs = [GenerateRequest(prompt=p, max_tokens=24, speculative=spec) for p in PROMPTS]
    engine = ParallelGenerator(session)
    run_all(engine, [Job(r) for r in reqs])
    again = [Job(replace(r, prompt=r.prompt + " and")) for r in reversed(reqs)]
    for job in again:
        engine.add(job)
    engine.step()
    assert [r.decoder.seq for r in engine.running] == [3, 2, 1, 0]
    return engine, again


def test_in_pools_of_their_own_a_steps_rows_go_in_sequence_order_and_decode_as_one_graph():
    """llama.cpp splits a batch over several pools into ubatches of consecutive sequence ids only (split_equal,
    sequential): rows in arrival order (3, 2, 1, 0) decoded as four graphs a step, none reused. In sequence
    order a step is one graph, the same each step, which llama.cpp reuses."""
    path = str(synth("glm4moe", "oracle", agree=1.0).path())
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, kv_unified=False)) as session:
        engine, again = reversed_second_wave(session, SPECULATION_OFF)
        reused, steps = session.target.graphs_reused(), 0
        while not engine.idle:
            engine.step()
            steps += 1
        reused = session.target.graphs_reused() - reused
    assert all(job.error is None for job in again)
    assert reused >= steps - 2, (steps, reused)


def test_in_pools_of_their_own_the_draft_steps_rows_go_in_sequence_order_too(monkeypatch):
    """The MTP context has a pool per sequence as the target does: its shared draft decodes put the lanes'
    rows in sequence order as well; each reply and its drafts are what they are alone."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, kv_unified=False)) as session:
        engine, again = reversed_second_wave(session, mtp(3))
        orders = {"target": [], "draft": []}
        for name, ctx in (("target", session.target), ("draft", session.mtp_drafter.ctx)):
            def watching(batch, decode=ctx.decode, seen=orders[name]):
                seen.append([batch._seq[i] for i in range(batch.n)])
                decode(batch)
            monkeypatch.setattr(ctx, "decode", watching)
        run_all(engine, [])
        monkeypatch.undo()
    assert all(job.error is None for job in again)
    for name, seen in orders.items():
        assert any(len(set(seqs)) > 1 for seqs in seen), name
        assert all(seqs == sorted(seqs) for seqs in seen), (name, seen)
    reqs = [job.request for job in again]
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, kv_unified=False)) as session:
        run_all(ParallelGenerator(session), [Job(replace(r, prompt=r.prompt.removesuffix(" and")))
                                            for r in reversed(reqs)])
        # the same requests' second turns, arriving in sequence order this time: the same replies
        engine, jobs = ParallelGenerator(session), [Job(r) for r in reversed(reqs)]
        run_all(engine, jobs)
    assert [j.result.tokens for j in jobs] == [j.result.tokens for j in reversed(again)]
    assert [j.result.drafts_per_round for j in jobs] == [j.result.drafts_per_round for j in reversed(again)]


def test_in_pools_of_their_own_a_prompt_chunk_goes_in_sequence_order_among_the_verify_rows(monkeypatch):
    """A newcomer's prompt chunk went in after the running sequences' verify rows: sequence 0 reading its
    follow-up while 1-3 verified gave rows 1, 2, 3, 0, two graphs (llama.cpp's split_equal puts consecutive ids
    only in one ubatch); eight follow-ups read so took 57-60 ms where one graph takes 49. Every row of the
    step goes in sequence order now, and each reply is what it is when the four follow-ups arrive together."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    reqs = [GenerateRequest(prompt=p, max_tokens=16, speculative=mtp(3), record_drafts=True) for p in PROMPTS]
    follow_ups = [replace(r, prompt=r.prompt + " and") for r in reqs]
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, kv_unified=False)) as session:
        engine = ParallelGenerator(session)
        run_all(engine, [Job(r) for r in reqs])
        late = [Job(r) for r in follow_ups]
        for job in late[1:]:
            engine.add(job)
        engine.step()  # 1-3 read their new token and decode from here on
        assert sorted(r.decoder.seq for r in engine.running) == [1, 2, 3]
        engine.add(late[0])
        seen, decode = [], session.target.decode

        def watching(batch):
            seen.append([batch._seq[i] for i in range(batch.n)])
            decode(batch)

        monkeypatch.setattr(session.target, "decode", watching)
        engine.step()
        monkeypatch.undo()
        run_all(engine, [])
    assert set(seen[0]) == {0, 1, 2, 3} and len(seen[0]) > 4, seen  # seq 0's chunk beside three rounds' rows
    assert seen[0] == sorted(seen[0]), seen
    assert all(job.error is None for job in late)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4, kv_unified=False)) as session:
        engine = ParallelGenerator(session)
        run_all(engine, [Job(r) for r in reqs])
        together = [Job(r) for r in follow_ups]
        run_all(engine, together)
    assert [j.result.tokens for j in late] == [j.result.tokens for j in together]
    assert [j.result.drafts_per_round for j in late] == [j.result.drafts_per_round for j in together]


def test_a_batch_of_sequences_without_an_mtp_lane_asks_the_target_for_no_hidden_states(monkeypatch):
    """Exporting every row's hidden state for an MTP head makes llama.cpp run the last layer over every row;
    a decode whose rows are all of requests with speculation off (or n-gram drafting) does without, one with
    an MTP lane's rows exports them. Each reply is the one it gets alone, the MTP lane's drafts included."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    specs = [SPECULATION_OFF, mtp(3), ngram(3), SPECULATION_OFF]
    reqs = [replace(r, speculative=s, max_tokens=24 + 12 * i)
            for i, (r, s) in enumerate(zip(requests(SPECULATION_OFF), specs, strict=True))]
    solo, noise = alone(path, reqs, 4)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=4)) as session:
        engine, jobs, seen = ParallelGenerator(session), [Job(r) for r in reqs], []
        decode = session.target.decode

        def watching(batch):  # (the batch has a row of the MTP request's sequence, hidden states exported)
            lane = {r.decoder.seq for r in engine.running if r.job is jobs[1]}
            seen.append((bool(lane & {batch._seq[i] for i in range(batch.n)}), session.target.exports_hidden))
            decode(batch)

        monkeypatch.setattr(session.target, "decode", watching)
        run_all(engine, jobs)
        monkeypatch.undo()
    for s, job in zip(solo, jobs, strict=True):
        same_as_alone(s, job.result, noise)
    assert (True, True) in seen and (False, False) in seen  # (the others decode on after the MTP reply ends)
    assert all(with_lane == exported for with_lane, exported in seen), seen


def test_a_short_prompt_is_read_before_the_rest_of_a_long_one():
    """A request of a few tokens arriving while another reads a long prompt (an agent's follow-up beside
    another client's long document) has its first token after the next step, not after the long prompt is
    read; the long one still reads with the batch's remaining room, and both replies are what they are alone."""
    path = str(synth("glm4moe", "mixed", agree=0.7, reads="hidden").path())
    reqs = [GenerateRequest(prompt=" the river model" * 100, max_tokens=8, speculative=mtp(3)),  # 1,500 tokens
            GenerateRequest(prompt=PROMPTS[1], max_tokens=8, speculative=mtp(3))]
    solo, noise = alone(path, reqs, 4)  # (a one-sequence session of 2,048 tokens)
    with Session(LoadOptions(path=path, n_ctx=2048, parallel=2)) as session:
        engine, jobs = ParallelGenerator(session), [Job(r) for r in reqs]
        engine.add(jobs[0])
        engine.step()
        engine.add(jobs[1])
        engine.step()
        long, short = sorted(engine.running, key=lambda r: r.job is jobs[1])
        assert short.prefilled and not long.prefilled and long.cursor > 512
        run_all(engine, [])
    for s, job in zip(solo, jobs, strict=True):
        same_as_alone(s, job.result, noise)


@pytest.mark.parametrize("arch", ["step35", "mimo2"])
def test_chained_heads_catch_every_sequence_up_in_one_decode_per_head(arch, monkeypatch):
    """Chained heads cannot fold their catch-up into a draft: each lane defers it, and before the lanes
    draft the engine decodes all their backlogs together, one decode per head (not one per sequence and
    head). Counted on the steps where no prompt is read and no reply ends (those catch up on their own)."""
    path, heads = str(synth(arch, "random").path()), heads_for(arch)
    reqs = requests(mtp(heads), n=3)
    with Session(LoadOptions(path=path, n_ctx=512, parallel=3)) as session:
        catch_ups = count_decodes(session.mtp_drafter.ctx, monkeypatch, lambda batch: batch.n_outputs == 0)
        engine, jobs, per_step = ParallelGenerator(session), [Job(r) for r in reqs], []
        for job in jobs:
            engine.add(job)
        while not engine.idle:
            quiet = all(r.prefilled for r in engine.running)
            before, running = catch_ups[0], len(engine.running)
            engine.step()
            if quiet and len(engine.running) == running:
                per_step.append(catch_ups[0] - before)
        monkeypatch.undo()
    assert all(job.error is None for job in jobs)
    assert per_step and max(per_step) <= heads, per_step
    assert any(n == heads for n in per_step)  # the backlogs were caught up (three sequences, one decode per head)


def count_decodes(ctx, monkeypatch, which=lambda batch: True) -> list[int]:
    """Count the decodes of ``ctx`` whose batch ``which`` accepts (until ``monkeypatch.undo()``)."""
    calls, decode = [0], ctx.decode

    def counting(batch):
        calls[0] += bool(which(batch))
        decode(batch)

    monkeypatch.setattr(ctx, "decode", counting)
    return calls


def count_draft_decodes(ctx, monkeypatch) -> list[int]:
    """Count the decodes of ``ctx`` that draft (have an output row; a catch-up has none)."""
    return count_decodes(ctx, monkeypatch, lambda batch: batch.n_outputs > 0)


@pytest.mark.parametrize("n_seq", [2, 3])
@pytest.mark.parametrize("weights", ["mixed", "random"])
@pytest.mark.parametrize("arch", ["step35", "mimo2"])
def test_chained_heads_draft_every_sequence_s_step_in_one_decode(arch, weights, n_seq, monkeypatch):
    # chained heads select their block per decode: step i of every sequence that drafts goes into one
    # decode with head i selected, not one decode per sequence; a sequence that stops early (p_min) drops
    # out of the later steps, and each one's tokens and drafts round by round are those of it alone
    model = synth(arch, "mixed", agree=0.7, reads="hidden") if weights == "mixed" else synth(arch, "random")
    path, heads = str(model.path()), heads_for(arch)
    for n_max, p_min in [*((n, 0.0) for n in range(1, heads + 1)), (heads, 0.3)]:
        reqs = requests(mtp(n_max, p_min=p_min), n=n_seq)
        with Session(LoadOptions(path=path, n_ctx=512 * n_seq)) as session:
            assert session.mtp_status == "chained"
            calls = count_draft_decodes(session.mtp_drafter.ctx, monkeypatch)
            solo = [generate(session, replace(r, record_margins=True)) for r in reqs]
            alone_decodes = calls[0]
            monkeypatch.undo()
            noise = identity.measure_noise(session)
        with Session(LoadOptions(path=path, n_ctx=512, parallel=n_seq)) as session:
            calls = count_draft_decodes(session.mtp_drafter.ctx, monkeypatch)
            engine, jobs, per_step = ParallelGenerator(session), [Job(r) for r in reqs], []
            for job in jobs:
                engine.add(job)
            while not engine.idle:
                before = calls[0]
                engine.step()
                per_step.append(calls[0] - before)
            monkeypatch.undo()
        for s, job in zip(solo, jobs, strict=True):
            assert job.error is None, job.error
            same_as_alone(s, job.result, noise)
        assert max(per_step) <= min(n_max, heads), (n_max, p_min, per_step)  # one decode per head, not per sequence
        assert sum(per_step) < alone_decodes, (n_max, p_min, sum(per_step), alone_decodes)


def test_a_sequences_policy_learns_its_share_of_the_batch_not_the_whole():
    """Each sequence's adaptive policy schedules its own probes by what its rows cost: its share of the batch
    decode. Told the whole batch's time as its one-row verify, a draft step looked cheap beside it, and at a
    real vocabulary eight sequences probed every few steps (an LM-head row each) where none would pay."""
    from engine.speculative.settings import ADAPTIVE

    with Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=0.8).path()), n_ctx=512, parallel=4)) as session:
        engine = ParallelGenerator(session)
        times: list[float] = []
        decode = session.target.decode

        def timed(batch):
            t0 = time.perf_counter()
            decode(batch)
            if batch.n == 4:  # a step of the four sequences' plain rows
                times.append(time.perf_counter() - t0)

        session.target.decode = timed
        for prompt in PROMPTS[:4]:
            engine.add(Job(GenerateRequest(prompt=prompt, max_tokens=24, speculative=mtp(3, depth=ADAPTIVE))))
        while not engine.idle:
            engine.step()
        del session.target.decode
        policies = [p for m in engine.sequences.memory for p in m.drafters.policies.values()]
    assert len(policies) == 4 and len(times) >= 5
    whole = sorted(times)[len(times) // 2]
    for policy in policies:
        assert policy.costs.verify(1) < 0.6 * whole, (policy.costs.verify(1), whole)

"""Separate thread counts for the target and the MTP draft context, and
autotune's thread timing, on a tiny synthetic model."""

from __future__ import annotations

import pytest

from engine.autotune import threads
from engine.errors import ContextError
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF, mtp
from engine.worker import protocol as P
from tests.engine.conftest import synth

PROMPTS = [[{"role": "user", "content": "the river"}], [{"role": "user", "content": "a model of light"}]]


def test_the_draft_context_takes_its_own_thread_count():
    model = synth("glm4moe", "mixed", agree=0.7)
    session = Session(LoadOptions(path=str(model.path()), n_ctx=512, n_threads=2, n_threads_draft=1))
    try:
        assert session.target.threads == 2 and session.mtp_drafter is not None and session.mtp_drafter.ctx.threads == 1
        assert session.describe()["n_threads_draft"] == 1
        plain = generate(session, GenerateRequest(prompt=" the river", max_tokens=32, speculative=SPECULATION_OFF))
        drafted = generate(session, GenerateRequest(prompt=" the river", max_tokens=32, speculative=mtp(3)))
        assert drafted.tokens == plain.tokens and drafted.stats.rounds > 0
        session.set_threads(1, 0)  # 0: the same as the target's
        assert session.mtp_drafter.ctx.threads == 1 and session.options.n_threads == 1
        with pytest.raises(ContextError, match="n_threads"):
            session.set_threads(0)
    finally:
        session.close()


def test_the_load_request_carries_the_draft_threads():
    line = P.encode(P.LoadRequest(id="a", options=P.LoadOptions(n_threads=4, n_threads_draft=1)))
    assert P.decode_request(line).options.n_threads_draft == 1
    # left out: the same as n_threads
    assert P.decode_request('{"type": "load", "id": "b", "options": {}}').options.n_threads_draft == 0


def test_autotune_times_each_thread_count_and_leaves_the_winner_set():
    model = synth("glm4moe", "mixed", agree=0.7)
    session = Session(LoadOptions(path=str(model.path()), n_ctx=512, n_threads=2))
    try:
        choice = threads.choose(session, PROMPTS, [1, 2], max_tokens=16)
        assert choice.baseline == 2 and choice.threads in (1, 2)
        assert session.options.n_threads == choice.threads == session.target.threads
        rows = {m.threads: m for m in choice.measurements}
        assert set(rows) == {1, 2} and rows[2].ratios == [1.0, 1.0]  # the baseline against itself
        assert all(len(m.tps) == len(PROMPTS) and min(m.tps) > 0 for m in rows.values())
        draft = threads.choose(session, PROMPTS, [1], what="draft", spec=mtp(2), max_tokens=16)
        assert session.mtp_drafter is not None and session.mtp_drafter.ctx.threads == draft.threads
        assert draft.reason.startswith("draft threads")
    finally:
        session.close()

"""Autotune with the chat's sampling and at several concurrencies, against the real engine on synthetic
models (structure only: never a timing threshold)."""

from __future__ import annotations

import argparse

import pytest

from engine.autotune import cli, concurrency, search
from engine.autotune.profiles import ProfileStore, model_identity
from engine.generation import generator
from engine.generation.session import LoadOptions, Session
from engine.hardware.probe import probe
from engine.sampling import BALANCED
from engine.speculative.settings import SPECULATION_OFF, mtp
from tests.engine.conftest import synth

PROMPTS = [[{"role": "user", "content": t}] for t in (" the river", " a model", " water light", " north south")]


def test_speeds_are_timed_with_the_chats_sampling_seeded_alike_and_identity_is_checked_greedily(monkeypatch):
    asked: list[generator.GenerateRequest] = []
    real = search.generate
    monkeypatch.setattr(search, "generate", lambda session, request, **kw: asked.append(request) or
                        real(session, request, **kw))
    session = Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=1.0).path()), n_ctx=512))
    try:
        result = search.tune(session, PROMPTS[:2], max_tokens=12, settings=[SPECULATION_OFF, mtp(2)],
                             sampling=BALANCED)
    finally:
        session.close()
    assert result.sampling == "balanced"
    sampled = [r for r in asked if not r.sampling.greedy]
    assert sampled and all(r.sampling.temperature == BALANCED.temperature for r in sampled)
    # "off" and the setting sampled each prompt with one seed (a setting clearly slower on this tiny model
    # may stop after the first prompt: how many prompts ran is timing, not asserted)
    ran = [p for p in PROMPTS[:2] if any(r.messages == tuple(p) for r in sampled)]
    assert ran == PROMPTS[:len(ran)] and ran
    for messages in map(tuple, ran):
        seeds = {(r.speculative, r.sampling.seed) for r in sampled if r.messages == messages}
        assert {s for s, _ in seeds} == {SPECULATION_OFF, mtp(2)} and len({seed for _, seed in seeds}) == 1
    greedy = [r for r in asked if r.sampling.greedy and r.max_tokens == 12]
    assert {r.speculative for r in greedy} >= {SPECULATION_OFF, mtp(2)}  # the identity check's own runs
    (m,) = [m for m in result.measurements if m.setting == mtp(2)]
    assert m.identical and len(m.ratios) == len(ran) and m.drafted > 0


def test_concurrency_measures_total_speed_of_n_requests_together_for_each_setting():
    session = Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=1.0).path()), n_ctx=512, parallel=4))
    try:
        results = [concurrency.measure(session, PROMPTS, n, [mtp(2)], rounds=2, max_tokens=8, sampling=BALANCED)
                   for n in (2, 4)]
        with pytest.raises(ValueError, match="parallel >= 8"):
            concurrency.measure(session, PROMPTS, 8, [mtp(2)])
    finally:
        session.close()
    for n, result in zip((2, 4), results, strict=True):
        assert result.n == n and result.best in (SPECULATION_OFF, mtp(2))
        rows = {m.setting: m for m in result.measurements}
        assert set(rows) == {SPECULATION_OFF, mtp(2)}
        assert all(len(m.tps) == 2 and all(t > 0 for t in m.tps) for m in rows.values())
        assert rows[SPECULATION_OFF].ratios == [1.0, 1.0]
        assert rows[mtp(2)].drafted > 0 and rows[SPECULATION_OFF].acceptance is None
        assert f"N={n} setting" in result.table()


def test_the_command_stores_the_choice_per_concurrency_and_the_sampling(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path))
    model = synth("glm4moe", "oracle", agree=1.0).path()
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    args = parser.parse_args(["autotune", str(model), "--prompts", "2", "--tokens", "12", "--n-max", "2",
                              "--thread-options", "none", "--concurrency", "1,2", "--concurrency-rounds", "2"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "timed with balanced sampling" in out and "decision for 2 at once" in out
    (profile,) = ProfileStore().all_for(probe().fingerprint(), model_identity(model), profile_engine())
    assert profile.sampling == "balanced" and set(profile.concurrency) == {1, 2}
    assert profile.concurrency[1].setting == profile.setting
    assert profile.setting_for(2) == profile.concurrency[2].setting


def profile_engine() -> str:
    report = probe()
    return str(report.engine.get("cache_key") or report.engine.get("llama_cpp_python"))


def test_an_ngram_candidate_is_timed_on_a_first_reply_not_on_the_last_settings_reply():
    # the search runs every setting on the same prompt: an n-gram map that kept the previous run's reply
    # would draft it back, every draft accepted (a speedup no user sees on a first reply)
    from engine.autotune.search import _run
    from engine.generation.session import LoadOptions, Session
    from engine.speculative.settings import SpeculativeSettings
    from tests.engine.conftest import synth

    with Session(LoadOptions(path=str(synth("glm4moe", "mixed", agree=0.0).path()), n_ctx=512)) as session:
        messages = [{"role": "user", "content": "the river model"}]
        first = _run(session, messages, 48, SpeculativeSettings("ngram", 8))
        again = _run(session, messages, 48, SpeculativeSettings("ngram", 8))
    assert again.tokens == first.tokens
    assert again.stats.accepted == first.stats.accepted  # not the whole reply drafted back

"""Autotune against the real engine on synthetic models."""

from __future__ import annotations

from engine.autotune import search
from engine.generation.session import LoadOptions, Session
from tests.engine.conftest import synth

PROMPTS = [[{"role": "user", "content": t}] for t in (" the river", " a model", " water light", " north south")]


def test_drafts_that_are_never_accepted_leave_speculation_off():
    session = Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=0.0).path()), n_ctx=512))
    try:
        result = search.tune(session, PROMPTS, max_tokens=32, settings=[search.Setting(n) for n in range(0, 4)])
    finally:
        session.close()
    assert result.best == search.Setting(0)
    measured = {m.setting: m for m in result.measurements}
    assert measured[search.Setting(1)].acceptance == 0.0
    assert all(m.identical for m in result.measurements)


def test_clearly_slower_settings_are_dropped_after_one_prompt_and_the_tune_ends_early():
    session = Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=0.0).path()), n_ctx=512))
    try:
        settings = [search.Setting(n) for n in range(0, 5)]
        result = search.tune(session, PROMPTS, max_tokens=24, first_round=2, settings=settings)
    finally:
        session.close()
    spec = [m for m in result.measurements if m.setting.enabled]
    assert all(m.dropped_after == 1 and len(m.tps) == 1 and m.mean_ratio < search.CLEARLY_WORSE for m in spec)
    off = next(m for m in result.measurements if not m.setting.enabled)
    assert len(off.tps) == 1  # nothing left to compare with: no more prompts are spent
    assert result.best == search.Setting(0)

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
    # scored by rows decoded, not the clock: drafts never accepted make depth n cost 1 + n rows per token
    # (at most 0.5x "off"), on any machine under any load
    session = Session(LoadOptions(path=str(synth("glm4moe", "oracle", agree=0.0).path()), n_ctx=512))
    try:
        settings = [search.Setting(n) for n in range(0, 5)]
        result = search.tune(session, PROMPTS, max_tokens=24, first_round=2, settings=settings,
                             speed=search.speed_per_row)
    finally:
        session.close()
    spec = [m for m in result.measurements if m.setting.enabled]
    ratios = [m.mean_ratio for m in spec]
    assert ratios == sorted(ratios, reverse=True) and ratios[0] < 0.55  # about 1 / (1 + n)
    assert all(m.dropped_after == 1 and len(m.tps) == 1 for m in spec)
    off = next(m for m in result.measurements if not m.setting.enabled)
    assert len(off.tps) == 1  # nothing left to compare with: no more prompts are spent
    assert result.best == search.Setting(0)

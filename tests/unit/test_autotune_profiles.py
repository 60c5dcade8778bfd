"""Autotune profiles keyed by sampling and holding a choice per concurrency, on known measurements."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from engine.autotune import cli, concurrency
from engine.autotune.concurrency import ConcurrencyMeasurement
from engine.autotune.profiles import ConcurrencyChoice, Profile, ProfileStore, model_identity, new_profile
from engine.sampling import BALANCED, CREATIVE, GREEDY, PRECISE, sampling_key, sampling_label
from engine.speculative import stats_text
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp
from engine.speculative.stats import GenerationStats


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 5000)
    return path


def test_sampling_keys_name_the_presets_whatever_the_seed_and_hash_the_rest():
    assert sampling_key(GREEDY) == "greedy" and sampling_key(replace(GREEDY, seed=7)) == "greedy"
    assert [sampling_key(p) for p in (PRECISE, BALANCED, CREATIVE)] == ["precise", "balanced", "creative"]
    assert sampling_key(replace(BALANCED, seed=5)) == "balanced"
    warmer = sampling_key(replace(BALANCED, temperature=0.7))
    assert warmer.startswith("custom-") and warmer == sampling_key(replace(BALANCED, temperature=0.7, seed=3))
    assert warmer != sampling_key(replace(BALANCED, temperature=0.8))
    assert sampling_label(warmer) == "custom" and sampling_label("balanced") == "balanced"


def test_profiles_of_two_samplings_live_side_by_side(tmp_path, model):
    store = ProfileStore(tmp_path / "profiles.json")
    store.save(new_profile("hw", str(model), "e", mtp(3), 1.4, "greedy tune"))
    store.save(new_profile("hw", str(model), "e", mtp(2), 1.2, "balanced tune", sampling="balanced"))
    h = model_identity(model)
    assert store.find("hw", h, "e").setting == mtp(3)  # greedy: the default key
    assert store.find("hw", h, "e", "balanced").setting == mtp(2)
    assert store.find("hw", h, "e", "creative") is None
    assert {p.sampling for p in store.all_for("hw", h, "e")} == {"greedy", "balanced"}
    # the greedy profile keeps the key files had before sampling was part of it
    assert f"hw:{h}:e" in json.loads(store.path.read_text())
    # a lookup prefers the sampling asked for, else takes the newest other one as the best guess
    assert store.lookup(str(model), "hw", "e", "balanced").profile.sampling == "balanced"
    assert store.lookup(str(model), "hw", "e", "greedy").profile.sampling == "greedy"
    guess = store.lookup(str(model), "hw", "e", "creative").profile
    assert guess is not None and guess.sampling == "balanced"  # saved last
    assert store.stale_for(str(model), "hw", h, "e") == []  # another sampling is not another machine


def test_old_profiles_read_as_greedy_and_measured_one_sequence_at_a_time(tmp_path, model):
    h = model_identity(model)
    v2 = {"fingerprint": "hw", "model_hash": h, "engine": "e", "model_path": str(model), "speedup": 1.3,
          "reason": "r", "created": 0.0, "threads": 1, "threads_draft": 0, "version": 2,
          "setting": {"mode": "mtp", "n_max": 3, "n_min": 0, "p_min": 0.0, "depth": "fixed"}}
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({f"hw:{h}:e": v2}))
    store = ProfileStore(path)
    found = store.lookup(str(model), "hw", "e", "balanced").profile
    assert found is not None and found.sampling == "greedy" and found.concurrency == {}
    assert found.setting_for(1) == found.setting_for(4) == mtp(3)
    assert found.outdated and "greedy decoding only" in found.outdated_text
    assert store.find("hw", h, "e", "greedy") == found


def test_the_choice_per_concurrency_is_stored_and_a_server_gets_the_nearest_measured_one(tmp_path, model):
    adaptive = mtp(4, depth="adaptive")
    profile = new_profile("hw", str(model), "e", mtp(3), 1.4, "r", sampling="balanced", concurrency={
        1: ConcurrencyChoice(mtp(3), 1.4), 2: ConcurrencyChoice(adaptive, 1.1), 4: ConcurrencyChoice(SPECULATION_OFF,
                                                                                                  1.0)})
    store = ProfileStore(tmp_path / "profiles.json")
    store.save(profile)
    again = store.find("hw", model_identity(model), "e", "balanced")
    assert again == profile and again.concurrency[2].setting.adaptive
    assert [again.setting_for(n) for n in (1, 2, 3, 4, 8)] == [mtp(3), adaptive, adaptive, SPECULATION_OFF,
                                                              SPECULATION_OFF]
    assert Profile.from_json(json.loads(json.dumps(profile.to_json()))) == profile


def rows(**ratios: list[float]) -> list[ConcurrencyMeasurement]:
    settings = {"off": SPECULATION_OFF, "mtp2": mtp(2), "mtp3": mtp(3), "adaptive": mtp(4, depth="adaptive")}
    return [ConcurrencyMeasurement(settings[k], [50 * r for r in v], v) for k, v in ratios.items()]


def test_under_concurrency_the_fastest_setting_beyond_the_noise_wins_else_off():
    best, reason = concurrency.decide(rows(off=[1.0] * 3, mtp2=[1.2, 1.22, 1.19], adaptive=[1.3, 1.31, 1.29]), 2)
    assert best == mtp(4, depth="adaptive") and "with 2 at once" in reason and "1.30x" in reason
    # the batch is compute-bound: drafts cost more than they gain
    best, reason = concurrency.decide(rows(off=[1.0] * 3, mtp2=[0.8, 0.82, 0.79], mtp3=[0.7, 0.72, 0.69]), 4)
    assert best == SPECULATION_OFF and "stays off" in reason
    # fast on average, but noise
    best, _ = concurrency.decide(rows(off=[1.0] * 3, mtp3=[1.9, 0.6, 1.7]), 2)
    assert best == SPECULATION_OFF


def test_concurrency_candidates_are_the_fastest_alone_plus_adaptive_depth():
    finalists = [mtp(3), mtp(2), SpeculativeSettings("ngram", 4), mtp(1)]
    out = concurrency.candidates(finalists, deepest=4)
    assert out == [SPECULATION_OFF, mtp(3), mtp(2), SpeculativeSettings("ngram", 4), mtp(4, depth="adaptive")]
    assert concurrency.candidates([], deepest=0) == [SPECULATION_OFF]
    assert concurrency.candidates([mtp(4, depth="adaptive")], deepest=4).count(mtp(4, depth="adaptive")) == 1


def test_the_command_line_takes_a_preset_or_json_sampling_and_a_list_of_concurrencies():
    assert cli.parse_sampling("balanced") == BALANCED and cli.parse_sampling("greedy") == GREEDY
    assert cli.parse_sampling('{"temperature": 0.7}') == replace(GREEDY, temperature=0.7)
    for bad in ("warm", "[1]", '{"temperature": 9}'):
        with pytest.raises(ValueError):
            cli.parse_sampling(bad)
    assert cli.parse_concurrency("2,4") == [1, 2, 4] and cli.parse_concurrency("1") == [1]
    with pytest.raises(ValueError):
        cli.parse_concurrency("0,2")


def _snapshot():
    s = GenerationStats(settings=mtp(3), generated_tokens=15)
    for _ in range(4):
        s.record_round(3, 2)
    return s.snapshot()


def test_the_headline_states_an_autotuned_speedup_only_for_the_sampling_it_was_measured_with():
    snap = _snapshot()
    same = stats_text.headline(snap, 1.4, measured_with="balanced", sampling="balanced")
    assert same == "MTP: 1.4× faster than without (autotuned)"
    other = stats_text.headline(snap, 1.4, measured_with="greedy", sampling="balanced")
    assert "1.4" not in other and other.endswith("tokens per step (autotuned for greedy)")
    custom = stats_text.headline(snap, 1.4, measured_with="custom-0123abcd", sampling="greedy")
    assert custom.endswith("(autotuned for custom)")
    assert stats_text.headline(snap, 1.4) == same  # callers that do not say: as before

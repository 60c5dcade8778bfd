"""Autotune's decision rule and its profiles, on known measurements."""

from __future__ import annotations

import json

from engine.autotune import search
from engine.autotune.profiles import ProfileMatch, ProfileStore, model_identity, new_profile
from engine.autotune.search import Measurement, Setting
from engine.speculative.settings import SPECULATION_OFF, mtp


def measured(setting: Setting, ratios: list[float], dropped: int | None = None) -> Measurement:
    m = Measurement(setting, tps=[100 * r for r in ratios], ratios=list(ratios))
    m.dropped_after = dropped
    return m


def test_the_fastest_setting_that_beats_off_beyond_the_noise_wins():
    result = search._decide([
        measured(Setting(0), [1.0] * 6),
        measured(Setting(2), [1.30, 1.28, 1.33, 1.29, 1.31, 1.30]),
        measured(Setting(3), [1.38, 1.40, 1.36, 1.41, 1.39, 1.37]),
        measured(Setting(4), [1.9, 0.7, 1.8, 0.6, 2.0, 0.8]),  # fast on average, but noise
    ])
    assert result.best == Setting(3)
    assert "1.39x" in result.reason


def test_when_nothing_clears_the_noise_the_answer_is_off():
    result = search._decide([
        measured(Setting(0), [1.0] * 4),
        measured(Setting(1), [1.02, 0.97, 1.03, 0.99]),
        measured(Setting(2), [0.6, 0.62, 0.58, 0.61]),
    ])
    assert result.best == Setting(0) and "stays off" in result.reason


def test_a_setting_whose_output_differs_beyond_noise_is_never_chosen():
    fast = measured(Setting(2), [1.5] * 5)
    fast.identity = "defect"
    result = search._decide([measured(Setting(0), [1.0] * 5), fast])
    assert result.best == Setting(0)


def test_a_setting_that_parts_from_off_at_a_near_tie_can_still_win():
    fast = measured(Setting(2), [1.5] * 5)
    fast.identity = "near_tie"
    result = search._decide([measured(Setting(0), [1.0] * 5), fast])
    assert result.best == Setting(2)
    assert "near tie" in result.table()


def test_settings_dropped_early_are_not_chosen():
    result = search._decide([measured(Setting(0), [1.0] * 4), measured(Setting(5), [1.5, 1.5], dropped=2)])
    assert result.best == Setting(0)


def test_candidates_respect_head_count_and_looped_depth():
    chained = search.candidates(3, chained=True)
    assert max(s.n_max for s in chained if s.mode == "mtp") == 3 and Setting(0) in chained
    looped = search.candidates(1, chained=False)
    assert max(s.n_max for s in looped) == 8 and Setting(2, 0.5) in looped and Setting(1, 0.5) not in looped


def test_profiles_persist_and_go_stale_when_hardware_engine_or_model_change(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 5000)
    store = ProfileStore(tmp_path / "profiles.json")
    profile = new_profile("hw1", str(model), "engineA", mtp(3), 1.4, "faster")
    store.save(profile)
    again = ProfileStore(tmp_path / "profiles.json")  # a restart
    found = again.find("hw1", model_identity(model), "engineA")
    assert found is not None and found.setting == mtp(3)
    assert again.find("hw2", model_identity(model), "engineA") is None  # other hardware
    assert again.find("hw1", model_identity(model), "engineB") is None  # other engine build
    assert again.stale_for(str(model), "hw2", model_identity(model), "engineA") == [found]
    model.write_bytes(b"GGUF" + b"\1" * 5000)  # the file changed
    assert again.find("hw1", model_identity(model), "engineA") is None
    assert again.stale_for(str(model), "hw1", model_identity(model), "engineA")


def test_profiles_written_before_off_had_one_name_still_read(tmp_path):
    store = ProfileStore(tmp_path / "profiles.json")
    old = {"fingerprint": "hw", "model_hash": "h", "engine": "e", "model_path": "/m.gguf", "speedup": 1.0,
           "reason": "r", "created": 0.0}
    store.path.write_text(json.dumps({
        "hw:h:e": {**old, "setting": {"mode": "none", "n_max": 3, "n_min": 0, "p_min": 0.0}},
        "hw:h2:e": {**old, "model_hash": "h2", "setting": {"mode": "mtp", "n_max": 2, "n_min": 0, "p_min": 0.5}},
    }))
    assert store.find("hw", "h", "e").setting == SPECULATION_OFF
    assert store.find("hw", "h2", "e").setting == mtp(2, 0.5)
    store.save(store.find("hw", "h", "e"))
    assert json.loads(store.path.read_text())["hw:h:e"]["setting"]["mode"] == "off"  # written the one way


def test_profile_lookup_hashes_the_file_and_reports_stale_profiles(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 100)
    store = ProfileStore(tmp_path / "profiles.json")
    assert store.lookup(str(model), "hw1", "e") == ProfileMatch(None, False)
    store.save(new_profile("hw1", str(model), "e", mtp(2), 1.2, "faster"))
    assert store.lookup(str(model), "hw1", "e").profile.setting == mtp(2)
    assert store.lookup(str(model), "hw2", "e") == ProfileMatch(None, True)


def test_autotune_messages_round_trip_and_bad_ones_are_refused():
    from engine.autotune import messages as M
    from engine.errors import ProtocolError

    row = M.ResultRow("mtp n_max=2", 120.0, 1.3, 1.1, 0.8, 4, True, "identical", False, [0.9, 0.7])
    result = M.ResultMessage(mtp(2), "mtp n_max=2", "faster", [row])
    assert M.decode(json.loads(M.encode(result))) == result
    progress = M.ProgressMessage(3, 10, "off", 100.0, 1.0)
    assert M.decode(json.loads(M.encode(progress))) == progress
    try:
        M.decode({"type": "progress", "step": "three"})
    except ProtocolError as exc:
        assert "progress.step" in str(exc) or "missing field" in str(exc)
    else:
        raise AssertionError("a bad message was accepted")


def test_a_head_whose_drafts_are_never_accepted_is_named_as_such_not_as_missing():
    rejected = [measured(Setting(n), [0.55], dropped=1) for n in (1, 2, 3)]
    for m in rejected:
        m.drafted, m.accepted = 90, 0
    result = search._decide([measured(Setting(0), [1.0]), *rejected])
    assert result.best == Setting(0)
    assert "never (or almost never) accepted" in result.reason and "0 of 270" in result.reason
    assert "no MTP head" not in result.reason and "identical" not in result.reason


def test_the_verdict_says_which_of_missing_head_slow_settings_or_changed_output_kept_speculation_off():
    alone = search._decide([measured(Setting(0), [1.0] * 3)])
    assert "no MTP head" in alone.reason
    slow = measured(Setting(2), [0.6], dropped=1)
    slow.drafted, slow.accepted = 100, 40
    assert "slower than no speculation" in search._decide([measured(Setting(0), [1.0]), slow]).reason
    wrong = measured(Setting(2), [1.5] * 4)
    wrong.drafted, wrong.accepted, wrong.identity = 100, 80, "defect"
    reason = search._decide([measured(Setting(0), [1.0] * 4), wrong]).reason
    assert "changed the output" in reason and "no MTP head" not in reason


def test_candidates_add_adaptive_depth_and_ngram_drafting():
    looped = search.candidates(1, chained=False)
    assert mtp(8, depth="adaptive") in looped
    modes = {(s.mode, s.depth) for s in looped}
    assert {("ngram", "fixed"), ("ngram", "adaptive"), ("mtp+ngram", "fixed"), ("mtp+ngram", "adaptive")} <= modes
    # a model without a head still gets n-gram drafting, never MTP
    headless = search.candidates(0, chained=False)
    assert Setting(0) in headless and {s.mode for s in headless} == {"off", "ngram"}
    capped = search.candidates(1, chained=False, n_max_cap=3)
    assert max(s.n_max for s in capped) == 3


def test_the_reason_says_by_how_much_the_winner_beat_the_runner_up():
    result = search._decide([
        measured(Setting(0), [1.0] * 6),
        measured(Setting(3), [1.30, 1.28, 1.33, 1.29, 1.31, 1.30]),
        measured(mtp(8, depth="adaptive"), [1.43, 1.41, 1.46, 1.42, 1.44, 1.43]),
    ])
    assert result.best == mtp(8, depth="adaptive")
    assert "runner-up mtp n_max=3 (1.30x)" in result.reason and "+10%" in result.reason


def test_a_thread_count_wins_only_beyond_the_noise():
    from engine.autotune.threads import ThreadMeasurement, decide

    def rows(**ratios: list[float]) -> list[ThreadMeasurement]:
        return [ThreadMeasurement(int(k[1:]), [100 * r for r in v], v) for k, v in ratios.items()]

    # 1 thread is clearly faster than 2 (the baseline): a busy core
    assert decide(rows(t2=[1.0] * 3, t1=[5.0, 4.1, 6.2]), baseline=2) == 1
    # within the noise: keep the baseline
    assert decide(rows(t2=[1.0] * 3, t1=[1.3, 0.8, 1.1]), baseline=2) == 2
    # the fastest of two winners
    assert decide(rows(t4=[1.0] * 3, t2=[1.2, 1.21, 1.19], t3=[1.4, 1.41, 1.39]), baseline=4) == 3


def test_an_older_profile_stays_valid_and_says_it_is_outdated(tmp_path):
    from engine.autotune.profiles import PROFILE_VERSION, Profile

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 5000)
    old = {"fingerprint": "hw1", "model_hash": model_identity(model), "engine": "e", "model_path": str(model),
           "setting": {"mode": "mtp", "n_max": 3, "n_min": 0, "p_min": 0.0}, "speedup": 1.3, "reason": "r",
           "created": 0.0}  # as version 1 wrote it: no version, no threads, no depth
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps({"hw1:" + model_identity(model) + ":e": old}))
    found = ProfileStore(path).find("hw1", model_identity(model), "e")
    assert found is not None and found.setting == mtp(3) and found.outdated and found.threads == 0
    fresh = new_profile("hw1", str(model), "e", mtp(8, depth="adaptive"), 1.5, "r", threads=1, threads_draft=1)
    assert fresh.version == PROFILE_VERSION and not fresh.outdated
    again = Profile.from_json(json.loads(json.dumps(fresh.to_json())))
    assert again == fresh and again.setting.adaptive


def test_of_two_draft_vocabulary_cuts_that_beat_the_whole_one_the_faster_is_kept():
    from engine.autotune.draft_vocab import VocabChoice, VocabMeasurement, cuts_for, winner

    def cut(n: int, ratios: list[float]) -> VocabMeasurement:
        return VocabMeasurement(n, tps=[20 * r for r in ratios], ratios=list(ratios))

    whole = cut(0, [1.0] * 3)
    assert cuts_for(151_936) == (65_536, 32_768) and cuts_for(129_280) == (32_768,) and cuts_for(32_000) == ()
    # both beat the whole vocabulary beyond the noise: the faster one (here the larger cut, which loses fewer drafts)
    assert winner([whole, cut(65_536, [1.21, 1.19, 1.20]), cut(32_768, [1.12, 1.10, 1.11])]) == 65_536
    assert winner([whole, cut(65_536, [1.21, 1.19, 1.20]), cut(32_768, [1.31, 1.29, 1.30])]) == 32_768
    # a faster mean is not enough where its lower bound does not clear 1.0
    noisy = cut(32_768, [2.0, 0.6, 1.9])
    assert winner([whole, cut(65_536, [1.05, 1.04, 1.06]), noisy]) == 65_536
    assert winner([whole, cut(65_536, [1.0, 0.98, 1.01]), noisy]) == 0
    lost = VocabChoice(0, [whole, cut(65_536, [1.0, 0.98, 1.01]), noisy], 151_936)
    assert "first 65,536 or 32,768 was not faster" in lost.reason

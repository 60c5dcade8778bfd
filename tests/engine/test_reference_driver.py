"""Our MTP loop against llama.cpp's own C++ driver, round by round.

``llama-speculative-simple`` is built from the same sdist and patches as the
engine (``packaging/build_reference_driver.py``; ``bootstrap.sh --test``
builds or takes it from the cache). Both run greedy on the same file and
prompt and start the same way (prefill all but the last prompt token, draft
from it); each round's position, drafted tokens, accepted count and the
target's next token must be equal.

The models are random and mixed weights whose heads read the trunk's hidden
state: a head that reads only the token (the oracle models) drafts the same
whatever hidden state it is given, so it cannot catch a wrong one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import reference
from engine.bench.driver_loop import driver_rounds
from engine.generation.session import LoadOptions, Session
from engine.gguf.sidecar import MTP_ARCHITECTURES
from tests.engine import conftest
from tests.engine.conftest import synth

PROMPT = " the river model"
N_TOKENS = 48
N_CTX = 512
# Every architecture with a synthetic model; the list grows with conftest's.
ARCHS = tuple(a for a in getattr(conftest, "ALL_MTP_ARCHS", conftest.ARCHS) if a in MTP_ARCHITECTURES)
PACKAGING = Path(__file__).resolve().parents[2] / "packaging"


def _driver() -> Path:
    """The driver bootstrap recorded for this environment's engine.

    Skips only where this environment was not set up by the README's test
    command and nobody built the driver by hand; after ``bootstrap.sh
    --test`` a missing or mismatched driver is a failure.
    """
    sys.path.insert(0, str(PACKAGING))
    import build_engine  # type: ignore[import-not-found]
    import build_reference_driver as brd  # type: ignore[import-not-found]

    record_path = Path(sys.prefix) / brd.RECORD_NAME
    if record_path.exists():
        record = json.loads(record_path.read_text())
        binary = Path(record["path"])
        if not binary.is_file():
            pytest.fail(f"bootstrap recorded {binary}, which is gone: run ./packaging/bootstrap.sh --test again")
        engine = Path(sys.prefix) / build_engine.BUILD_RECORD_NAME
        engine_key = json.loads(engine.read_text()).get("cache_key") if engine.exists() else None
        if engine_key != record["cache_key"]:
            pytest.fail(f"the driver was built for {record['cache_key']} but the engine installed is {engine_key}: "
                        "run ./packaging/bootstrap.sh --test again")
        return binary
    binary = brd.driver_path("cpu")
    if binary.is_file():
        return binary
    pytest.skip("llama.cpp's llama-speculative-simple is not built and this environment was not set up by "
                "./packaging/bootstrap.sh --test (the README's test command builds it)")


@pytest.fixture(scope="module")
def driver() -> Path:
    return _driver()


def _open(model, layout: str, fold: bool = True) -> tuple[Session, Path, Path | None]:
    if layout == "sidecar":  # the driver loads an MTP-only GGUF with --spec-draft-model
        trunk, side = model.path("trunk"), model.path("sidecar")
        return Session(LoadOptions(path=str(trunk), sidecar=str(side), n_ctx=N_CTX, fold=fold)), trunk, side
    path = model.path("combined")
    return Session(LoadOptions(path=str(path), n_ctx=N_CTX, fold=fold)), path, None


def _depths(session: Session) -> range:
    # chained heads draft at most one token per head, as the driver caps them
    return range(1, min(4, session.max_draft) + 1)


def _assert_same_rounds(ours: reference.OursRun, theirs: reference.DriverRun, n_max: int) -> None:
    # The driver's rounds past the token budget are left out (reference.parse_rounds: at a budget of 0
    # llama.cpp still drafts a full, untruncated draft; our loop stops there). Everything else is exact:
    # the same positions, drafts, accepted counts and next tokens, the last budget-capped round included.
    diffs = reference.round_differences(ours.rounds, theirs)
    assert not diffs, f"n_max={n_max}:\n" + "\n".join(diffs[:5])
    assert len(theirs.unbudgeted) <= 2  # at most: budget 0 accepts nothing, then budget -1


def _assert_same_as_driver_loop(model, layout: str, ours: reference.OursRun, theirs: reference.DriverRun,
                                n_max: int) -> None:
    """A target that cannot remove part of a sequence (qwen3next): the driver
    replays after each partial accept, so it drafts at other positions than we
    do, and keeps a stale ``pending_h`` across the replay
    (engine/bench/driver_loop.py). Its loop re-run in Python on our drafter
    must give the C++ driver's rounds exactly; with the hidden state restored,
    it must give ours wherever both draft at the same position."""
    session, _, _ = _open(model, layout, fold=False)  # the driver catches up on each verify at once
    try:
        assert session.rollback_strategy == "checkpoint"
        as_built, extra = driver_rounds(session, PROMPT, N_TOKENS, n_max, restore_pending_h=False)
        assert as_built == theirs.rounds, f"n_max={n_max}"
        assert extra == theirs.unbudgeted, f"n_max={n_max}"
        fixed, _ = driver_rounds(session, PROMPT, N_TOKENS, n_max, restore_pending_h=True)
    finally:
        session.close()
    mine = {r.pos: r for r in ours.rounds}
    common = [r for r in fixed if r.pos in mine]
    assert len(common) >= len(fixed) // 2, f"n_max={n_max}: too few common positions to compare"
    for r in common:
        a = mine[r.pos]
        assert (a.accepted, a.drafted, a.drafts) == (r.accepted, r.drafted, r.drafts), \
            f"n_max={n_max}: ours {a}, the driver's loop {r}"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("weights", ["random", "mixed"])
@pytest.mark.parametrize("layout", ["combined", "sidecar"])
def test_rounds_equal_llama_cpp_driver(driver, arch, weights, layout):
    model = synth(arch, weights, agree=0.7, reads="hidden")
    session, path, side = _open(model, layout)
    try:
        assert session.mtp_drafter is not None
        for n_max in _depths(session):
            ours = reference.run_ours(session, PROMPT, N_TOKENS, n_max)  # folding as the engine decides
            theirs = reference.run_driver(driver, path, PROMPT, N_TOKENS, n_max, 1, side, n_ctx=N_CTX)
            if theirs.replays:
                _assert_same_as_driver_loop(model, layout, ours, theirs, n_max)
            else:
                _assert_same_rounds(ours, theirs, n_max)
    finally:
        session.close()


@pytest.mark.parametrize("where", ["middle draft", "last draft", "bonus"])
def test_an_end_of_generation_token_counts_as_in_llama_cpp(driver, tmp_path, where):
    """Finding 8: an end-of-generation draft the target agrees with is counted
    as accepted only when it is the draft's last token
    (``common_sampler_sample_and_accept_n``). An oracle model whose head always
    agrees, with one word of its greedy path declared end-of-turn, puts that
    token into a draft's middle, its end, or the bonus row."""
    model = synth("glm4moe", "oracle", agree=1.0)
    session = Session(LoadOptions(path=str(model.path()), n_ctx=N_CTX))
    try:
        base = reference.run_ours(session, PROMPT, N_TOKENS, 3)
    finally:
        session.close()
    r = base.rounds[2]
    index = r.pos + {"middle draft": 1, "last draft": r.drafted - 1, "bonus": r.drafted}[where]
    eog = base.tokens[index]
    assert r.drafted == 3 and eog not in base.tokens[:index]
    path = tmp_path / "eog.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(model.path()), str(path),
                    "--special-token-by-id", "eot", str(eog), "--force"], check=True, capture_output=True)
    session = Session(LoadOptions(path=str(path), n_ctx=N_CTX))
    try:
        ours = reference.run_ours(session, PROMPT, N_TOKENS, 3)
    finally:
        session.close()
    theirs = reference.run_driver(driver, path, PROMPT, N_TOKENS, 3, 1, n_ctx=N_CTX)
    assert ours.rounds[-1].accepted == (1 if where == "middle draft" else 3)
    assert not reference.round_differences(ours.rounds, theirs)
    assert theirs.unbudgeted == []  # both stopped at the token


def test_a_cut_driver_log_is_parsed_as_far_as_it_goes():
    log = ("spec draft:  - seq_id 0, draft candidate   0, pos   0:     12 (0.5) 'a'\n"
           "spec draft:  - seq_id 0, draft candidate   1, pos   0:     13 (0.2) 'b'\n"
           "spec draft:  - seq_id 0, draft candidate   0, pos   1:     14 (0.5) '\n'\n"
           "accepted 1/2 draft tokens, the last target token is: (15)\n"
           "spec draft:  - seq_id 0, draft candidate   0, pos   0:     16 (0.5) 'c'\n"
           "partial acceptance: 0 < 1, restoring checkpoint\n"
           "accepted 1/1 draft tokens, the last target token is: (17)\n")
    rounds, unbudgeted, replays = reference.parse_rounds(log, n_predict=10)
    assert rounds == [reference.Round(0, 1, 2, (12, 14), 15), reference.Round(2, 0, 1, (16,), None)]
    assert unbudgeted == [] and replays == 1


def test_a_draft_may_differ_from_the_drivers_only_at_a_numeric_tie_past_what_was_accepted():
    theirs = reference.DriverRun([reference.Round(0, 1, 3, (5, 6, 9), 7)], [], 0, 3, 1, 4, 1.0)

    def ours(drafts, margins):
        return [reference.Round(0, 1, 3, drafts, 7, margins)]

    assert not reference.round_differences(ours((5, 6, 36), (2.0, 1.0, 0.002)), theirs)  # a tie, not accepted
    assert reference.round_differences(ours((5, 6, 36), (2.0, 1.0, 0.5)), theirs)  # a clear choice: a difference
    assert reference.round_differences(ours((4, 6, 9), (0.002, 1.0, 1.0)), theirs)  # an accepted draft: never

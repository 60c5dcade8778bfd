"""Qwen3.8-Flash-Next (``qwen4exp``): the MTP head our engine patch adds.

The head only exists in the patched llama.cpp (packaging/patches/
0003-qwen4exp-mtp-head.patch); the unpatched loader refuses a qwen4exp file
that carries its MTP block ("wrong number of tensors"). These tests run the
real patched engine on tiny synthetic qwen4exp models (engine.synth.derived:
hyper-connections, delta-net + dense attention layers, MoE with a shared
expert, a QSA indexer kept dense):

1. the combined file, and trunk + sidecar, load with one MTP head whose hidden
   state is the wide pre-collapse residual (hc · n_embd);
2. greedy output with MTP at n_max 1..4 and 8 is plain greedy output
   (engine.generation.identity), rolling the hybrid target back by n_rs_seq;
3. the sidecar variants users met (seed 002): blocks numbered from blk.0
   (relative) are named by the doctor and fixed by Repair; the head's mixer
   stored twice (output_hc_* and blk.N.nextn.hc_head_*) loads here, is named
   by the doctor, and Repair writes a copy without the extra names.

Random weights (every weight random) and mixed weights (token maps plus small
random writers, so drafts are partly accepted). No oracle: the hyper-connection
mixers (sigmoid gates over normalised streams) leave no weight setting whose
drafts are predictable by hand.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from engine.generation import identity
from engine.gguf.facts import read_facts
from engine.gguf.sidecar import assess
from engine.store.doctor import diagnose
from engine.store.repair import repair
from tests.engine.test_mtp_every_arch import AGREE, open_session, run

ARCH = "qwen4exp"
HC = 4  # hyper_connection.count of the synthetic models (engine.synth.derived)


def model(weights: str = "random", seed: int = 0):
    from tests.engine.conftest import synth

    return synth(ARCH, weights, agree=AGREE, seed=seed)


def test_the_mtp_head_loads_from_the_combined_file_and_from_a_sidecar():
    m = model()
    for layout in ("combined", "sidecar"):
        session = open_session(m, layout)
        try:
            assert session.mtp_drafter is not None, session.mtp_unavailable_reason
            assert session.n_heads == 1
            # the head reads the wide residual: hc streams of n_embd, not the collapsed n_embd
            assert session.mtp_drafter.n_embd == HC * m.spec.dims.n_embd
            assert session.target.n_rs_seq >= 8  # hybrid target: rolled back by snapshots
            assert run(session, 3).stats.rounds > 0
        finally:
            session.close()


def test_a_trunk_file_decodes_without_an_mtp_head():
    session = open_session(model(), "trunk")
    try:
        assert session.mtp_drafter is None
        assert run(session, None).tokens
    finally:
        session.close()


def test_a_trunk_only_export_that_still_declares_the_mtp_block_loads(tmp_path: Path):
    # converters that drop the head but keep nextn_predict_layers (the trunk_only probe)
    from engine.runtime import Model
    from engine.synth.writer import _write

    m = model()
    n = m.spec.dims.n_trunk
    out = tmp_path / "trunk-only.gguf"
    _write(out, m.spec, m.vocab, [(t, a) for t, a in m._build().items() if not t.startswith(f"blk.{n}.")],
           "trunk-only", m.metadata(), keep_f32=m._keep_f32())
    assert read_facts(out).layout == "trunk-only"
    for load_mtp in (False, True):
        with Model(out, load_mtp=load_mtp) as loaded:
            assert (loaded.n_layer, loaded.n_layer_nextn) == (n, 1)


@pytest.mark.parametrize("layout", ["combined", "sidecar"])
@pytest.mark.parametrize("weights", ["random", "mixed"])
def test_greedy_output_with_mtp_is_the_plain_output(layout, weights):
    session = open_session(model(weights), layout)
    try:
        assert session.mtp_drafter is not None, session.mtp_unavailable_reason
        noise = identity.measure_noise(session)
        plain = run(session, None, record_margins=True)
        accepted = drafted = 0
        for n_max in (1, 2, 3, 4, 8):
            result = run(session, n_max)
            verdict = identity.classify(plain.tokens, plain.margins, result.tokens, noise)
            assert verdict.acceptable, f"n_max={n_max}: {verdict.describe()}"
            assert result.stats.rounds > 0
            accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
        if weights == "mixed":
            assert 0 < accepted < drafted, (accepted, drafted)
    finally:
        session.close()


@pytest.mark.parametrize("layout", ["combined", "sidecar"])
def test_the_chat_command_streams_the_plain_output_with_mtp_and_shows_acceptance(layout):
    # the "done when": synth, then chat --mtp --n-max 3 --temperature 0 equals chat without --mtp
    import subprocess
    import sys

    m = model("mixed")
    where = (["--model", str(m.path("combined"))] if layout == "combined"
             else ["--model", str(m.path("trunk")), "--sidecar", str(m.path("sidecar"))])

    def chat(*extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "engine", "chat", "the river", *where, "--max-tokens", "40", "--temperature", "0",
               "--raw", *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)

    plain, spec = chat(), chat("--mtp", "--n-max", "3")
    assert plain.stdout.strip() and spec.stdout == plain.stdout
    shown = r"\[mtp\] mtp n_max=3, rollback rs_seq: \d+ rounds, [1-9]\d*/\d+ drafts accepted"
    assert re.search(shown, spec.stderr), spec.stderr[-500:]


def test_the_doctor_names_a_relative_index_sidecar_and_repair_fixes_it(tmp_path: Path):
    m = model()
    target, side = m.path("trunk"), shutil.copy(m.path("sidecar-relative"), tmp_path / "mtp-relative.gguf")
    d = diagnose(target, side)
    assert not d.ok and d.repairable
    assert any("relative" in f.text and f.fixable for f in d.errors), d.report()
    fixed = repair(target, side)
    assert diagnose(target, fixed).ok
    assert read_facts(fixed).tensor_names == read_facts(m.path("sidecar")).tensor_names
    session = open_session_with(target, fixed)
    try:
        assert session.mtp_drafter is not None, session.mtp_unavailable_reason
        assert run(session, 2).stats.rounds > 0
    finally:
        session.close()


def test_a_sidecar_with_the_head_mixer_stored_twice_loads_is_named_and_repair_strips_the_copies(tmp_path: Path):
    m = model("mixed")
    target, side = m.path("trunk"), shutil.copy(m.path("sidecar-duplicates"), tmp_path / "mtp-dup.gguf")
    names = read_facts(side).tensor_names
    assert "output_hc_norm.weight" in names and f"blk.{m.spec.dims.n_trunk}.nextn.hc_head_norm.weight" in names
    d = diagnose(target, side)
    assert d.ok and d.repairable, d.report()
    assert any("duplicate mixer" in f.text for f in d.warnings), d.report()

    # this engine loads it as it is (both names are consumed) and drafts as with the clean sidecar
    as_is, clean = open_session_with(target, side), open_session_with(target, m.path("sidecar"))
    try:
        assert as_is.mtp_drafter is not None, as_is.mtp_unavailable_reason
        a, b = run(as_is, 3, record_drafts=True), run(clean, 3, record_drafts=True)
        assert a.drafts_per_round == b.drafts_per_round
    finally:
        as_is.close()
        clean.close()

    fixed = repair(target, side)
    fixed_names = read_facts(fixed).tensor_names
    assert not any(n.startswith("output_hc_") for n in fixed_names)
    assert set(fixed_names) == set(read_facts(m.path("sidecar")).tensor_names)
    assert not diagnose(target, fixed).warnings


def test_a_sidecar_without_any_head_mixer_is_refused_before_loading(tmp_path: Path):
    m = model()
    facts = read_facts(m.path("sidecar"))
    n = m.spec.dims.n_trunk
    stripped = tuple(t for t in facts.tensor_names if ".nextn.hc_head_" not in t)
    assert len(stripped) == len(facts.tensor_names) - 3
    a = assess(read_facts(m.path("trunk")), _with_names(facts, stripped))
    assert any(f"blk.{n} has no head mixer" in f.text for f in a.errors), [f.text for f in a.findings]


@pytest.mark.parametrize("n_ctx", [2048, 8192])
def test_models_fit_counts_the_wide_mtp_context_within_15_percent(n_ctx):
    # the trunk hands the head hc · n_embd wide rows: counting n_embd undercounts by a quarter here
    from engine.store.fit import estimate, measure

    m = model()
    for path, side in ((m.path("combined"), None), (m.path("trunk"), m.path("sidecar"))):
        est = estimate(path, n_ctx=n_ctx, sidecar=side)
        allocated = sum(measure(path, n_ctx=n_ctx, sidecar=side).values()) * 2**20
        assert est.mtp_context > 0
        assert abs(est.total - allocated) / allocated < 0.15, (est.lines(), allocated)


def open_session_with(target: Path | str, sidecar: Path | str):
    from engine.generation.session import LoadOptions, Session

    return Session(LoadOptions(path=str(target), sidecar=str(sidecar), n_ctx=512))


def _with_names(facts, names: tuple[str, ...]):
    from dataclasses import replace

    keep = [i for i, t in enumerate(facts.tensor_names) if t in set(names)]
    return replace(facts, tensor_names=names, tensor_shapes=tuple(facts.tensor_shapes[i] for i in keep),
                   tensor_count=len(names))

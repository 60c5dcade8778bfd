"""The sidecar rules shared by the load-time check and the doctor, Repair of the
broken sidecars users meet (issue 11, findings 2, 3 and 7), and the live probe."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from engine.errors import SidecarMismatch
from engine.gguf.facts import read_facts
from engine.gguf.header import read_header
from engine.gguf.sidecar import assess, check_sidecar, unexpected_tensors
from engine.store.doctor import diagnose
from engine.store.repair import RepairError, prove, repair
from tests.engine.conftest import ALL_MTP_ARCHS, synth

# -- finding 2: the allowlist is the loaders' own ---------------------------------------------

# What llama.cpp's --mtp export writes for the DeepSeek V3.2 / GLM-5 family and DeepSeek V4
# (names from vendor src/models/deepseek32.cpp, glm-dsa.cpp, deepseek4.cpp).
DSA_SIDECAR = [
    "token_embd.weight", "output_norm.weight", "output.weight",
    "blk.61.attn_norm.weight", "blk.61.attn_q_a.weight", "blk.61.attn_q_a_norm.weight", "blk.61.attn_q_b.weight",
    "blk.61.attn_kv_a_mqa.weight", "blk.61.attn_kv_a_norm.weight", "blk.61.attn_k_b.weight",
    "blk.61.attn_v_b.weight", "blk.61.attn_output.weight", "blk.61.ffn_norm.weight", "blk.61.ffn_gate_inp.weight",
    "blk.61.exp_probs_b.bias", "blk.61.ffn_gate_exps.weight", "blk.61.ffn_down_exps.weight",
    "blk.61.ffn_up_exps.weight", "blk.61.ffn_gate_shexp.weight", "blk.61.ffn_down_shexp.weight",
    "blk.61.ffn_up_shexp.weight",
    "blk.61.indexer.k_norm.weight", "blk.61.indexer.k_norm.bias", "blk.61.indexer.proj.weight",
    "blk.61.indexer.attn_k.weight", "blk.61.indexer.attn_q_b.weight",
    "blk.61.nextn.eh_proj.weight", "blk.61.nextn.enorm.weight", "blk.61.nextn.hnorm.weight",
    "blk.61.nextn.shared_head_norm.weight",
]
DEEPSEEK4_SIDECAR = [
    "token_embd.weight", "output_norm.weight", "output.weight",
    "output_hc_fn.weight", "output_hc_base.weight", "output_hc_scale.weight",
    "blk.43.attn_norm.weight", "blk.43.attn_sinks.weight", "blk.43.attn_q_a.weight", "blk.43.attn_kv.weight",
    "blk.43.attn_output_a.weight", "blk.43.attn_output_b.weight",
    "blk.43.hc_attn_fn.weight", "blk.43.hc_attn_base.weight", "blk.43.hc_attn_scale.weight",
    "blk.43.hc_ffn_fn.weight", "blk.43.hc_ffn_base.weight", "blk.43.hc_ffn_scale.weight",
    "blk.43.attn_compressor_kv.weight", "blk.43.attn_compressor_gate.weight",
    "blk.43.indexer.proj.weight", "blk.43.indexer.attn_q_b.weight",
    "blk.43.indexer_compressor_kv.weight", "blk.43.indexer_compressor_gate.weight",
    "blk.43.indexer_compressor_ape.weight", "blk.43.indexer_compressor_norm.weight",
    "blk.43.ffn_gate_exps.weight", "blk.43.ffn_gate_exps.scale",
    "blk.43.nextn.eh_proj.weight", "blk.43.nextn.enorm.weight", "blk.43.nextn.hnorm.weight",
]
LEGACY = ["blk.61.shared_head.head.weight", "blk.48.nextn.hc_head_fn.weight"]


@pytest.mark.parametrize("arch, names", [("deepseek32", DSA_SIDECAR), ("glm-dsa", DSA_SIDECAR),
                                         ("deepseek4", DEEPSEEK4_SIDECAR)])
def test_tensors_the_dsa_and_deepseek4_loaders_consume_are_accepted_and_legacy_names_are_not(arch, names):
    assert unexpected_tensors(names, arch) == []
    assert unexpected_tensors(names + LEGACY, arch) == LEGACY


def test_the_allowlist_is_per_architecture():
    # a hyper-connection tensor is deepseek4's; in a glm4moe file the loader would refuse it
    assert unexpected_tensors(["blk.4.hc_attn_fn.weight", "output_hc_fn.weight"], "glm4moe") == [
        "blk.4.hc_attn_fn.weight", "output_hc_fn.weight"]
    assert unexpected_tensors(["blk.4.ssm_a", "blk.4.ssm_conv1d.weight"], "qwen35") == []


def _vendored_llama_cpp(tmp_path: Path) -> Path:
    """The vendored llama.cpp's ``src/``: MTP_LLAMA_CPP_SRC, else unpacked from the pinned sdist the
    engine build keeps (packaging/bootstrap.sh leaves it in the wheel cache). Neither is a failure
    that says what to do, never a skip: a loader table that drifts from the loaders must not pass."""
    given = os.environ.get("MTP_LLAMA_CPP_SRC", "")
    if given and (Path(given) / "src" / "llama-arch.cpp").exists():
        return Path(given)
    import importlib.util
    import tarfile

    script = Path(__file__).resolve().parents[2] / "packaging" / "build_engine.py"
    spec = importlib.util.spec_from_file_location("build_engine_for_loader_table", script)
    build_engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_engine)
    sdist = build_engine.cached_sdist()
    if not sdist.is_file():
        pytest.fail(f"the pinned llama-cpp-python sdist is not at {sdist}: run packaging/bootstrap.sh once "
                    f"(it keeps it there), or set MTP_LLAMA_CPP_SRC to a vendored llama.cpp tree")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar if "/vendor/llama.cpp/src/" in m.name]
        tar.extractall(tmp_path / "sdist", members=members, filter="data")
    return next((tmp_path / "sdist").glob("llama_cpp_python-*/vendor/llama.cpp"))


def test_the_loader_table_is_what_the_vendored_loaders_create(tmp_path: Path):
    import importlib.util

    from engine.gguf import loader_tensors_table
    from engine.gguf.sidecar import MTP_ARCHITECTURES

    script = Path(__file__).resolve().parents[2] / "packaging" / "generate_loader_tensors.py"
    spec = importlib.util.spec_from_file_location("generate_loader_tensors", script)
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    # the engine is built with packaging/patches/ applied (qwen4exp's MTP head adds tensors)
    vendor, patches = _vendored_llama_cpp(tmp_path), sorted(generator.PATCH_DIR.glob("*.patch"))
    tree = generator.patched_copy(vendor, tmp_path, patches) if patches else vendor
    tensors, required, tied = generator.generate(tree, tuple(sorted(MTP_ARCHITECTURES)))
    assert {a: tuple(v) for a, v in tensors.items()} == loader_tensors_table.ARCH_TENSORS
    assert {a: tuple(v) for a, v in required.items()} == loader_tensors_table.REQUIRED_GLOBALS
    assert frozenset(tied) == loader_tensors_table.OUTPUT_TIED


# -- finding 7: deepseek4's MTP width is hc · n_embd -------------------------------------------

def _header_only(path: Path, arch: str, **keys: int) -> Path:
    import gguf

    w = gguf.GGUFWriter(path, arch)
    for k, v in keys.items():
        w.add_uint32(f"{arch}.{k.replace('__', '.')}", v)
    w.add_token_list(["a", "b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_deepseek4_hidden_width_is_the_hyper_connection_streams_times_n_embd(tmp_path):
    facts = read_facts(_header_only(tmp_path / "ds4.gguf", "deepseek4", embedding_length=64, block_count=3,
                                    nextn_predict_layers=1, hyper_connection__count=4))
    assert facts.n_embd == 64 and facts.n_embd_out == 256
    other = read_facts(_header_only(tmp_path / "ds4-hc2.gguf", "deepseek4", embedding_length=64, block_count=3,
                                    nextn_predict_layers=1, hyper_connection__count=2))
    texts = [f.text for f in assess(facts, other).errors]
    assert any("hidden size (n_embd_out) 128; this target has hidden size (n_embd_out) 256" in t for t in texts)


# -- finding 7: one set of rules for the doctor and the load-time check -----------------------

CHECKED = ("combined", "sidecar", "sidecar-relative", "sidecar-duplicates", "sidecar-missing", "sidecar-other-embd",
           "sidecar-other-vocab", "sidecar-other-layers", "sidecar-exact-duplicates", "sidecar-renumbered",
           "sidecar-offset")


def _loads(target, side) -> bool:
    try:
        check_sidecar(target, side)
    except SidecarMismatch:
        return False
    return True


@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
def test_the_doctor_and_the_load_time_check_agree_on_every_layout(arch):
    model = synth(arch)
    target = read_facts(model.path("trunk"))
    for layout in CHECKED:
        d = diagnose(model.path("trunk"), model.path(layout))
        assert d.ok == _loads(target, read_facts(model.path(layout))), (layout, d.report())


def test_a_combined_file_given_as_sidecar_fits_with_a_warning_and_loads():
    from engine.generation.generator import GenerateRequest, generate
    from engine.generation.session import LoadOptions, Session
    from engine.speculative.settings import SpeculativeSettings

    model = synth("glm4moe")
    d = diagnose(model.path("trunk"), model.path("combined"))
    assert d.ok and "complete model" in d.report() and d.warnings
    session = Session(LoadOptions(path=str(model.path("trunk")), sidecar=str(model.path("combined")), n_ctx=256))
    try:
        r = generate(session, GenerateRequest(prompt=" the", max_tokens=12, speculative=SpeculativeSettings("mtp", 2)))
        assert r.stats.drafted > 0 and r.stats.accepted == r.stats.drafted  # oracle head, agree 1.0
    finally:
        session.close()


# -- finding 7: a standalone export without token_embd / output --------------------------------

def _without(facts, *drop: str):
    keep = [(n, s) for n, s in zip(facts.tensor_names, facts.tensor_shapes, strict=True) if n not in drop]
    return dataclasses.replace(facts, tensor_names=tuple(n for n, _ in keep), tensor_shapes=tuple(s for _, s in keep),
                               tensor_count=len(keep))


def test_a_sidecar_without_the_token_embedding_is_refused_in_plain_words():
    model = synth("glm4moe")
    target, side = read_facts(model.path("trunk")), read_facts(model.path("sidecar"))
    with pytest.raises(SidecarMismatch, match=r"has no token_embd.weight \(the token embedding"):
        check_sidecar(target, _without(side, "token_embd.weight"))
    a = assess(target, _without(side, "token_embd.weight"))
    assert a.errors and not any(f.fixable for f in a.errors)


def test_a_head_without_an_lm_head_is_refused_where_the_loader_does_not_tie_it():
    model = synth("step35")
    target, side = read_facts(model.path("trunk")), read_facts(model.path("sidecar"))
    heads = [n for n in side.tensor_names if n.endswith("nextn.shared_head_head.weight")]
    check_sidecar(target, _without(side, "output.weight"))  # each head has its own LM head
    with pytest.raises(SidecarMismatch, match="neither blk.4.nextn.shared_head_head.weight nor output.weight"):
        check_sidecar(target, _without(side, "output.weight", *heads))
    glm = synth("glm4moe")
    glm_side = read_facts(glm.path("sidecar"))
    glm_heads = [n for n in glm_side.tensor_names if n.endswith("nextn.shared_head_head.weight")]
    # glm4moe's loader falls back to token_embd for the LM head
    check_sidecar(read_facts(glm.path("trunk")), _without(glm_side, "output.weight", *glm_heads))


# -- finding 7: renumbered metadata and any wrong offset, repaired from the target -------------

def _run(trunk: Path, side: Path):
    from engine.generation.generator import GenerateRequest, generate
    from engine.generation.session import LoadOptions, Session
    from engine.speculative.settings import SpeculativeSettings

    session = Session(LoadOptions(path=str(trunk), sidecar=str(side), n_ctx=256))
    try:
        return generate(session, GenerateRequest(prompt=" the river", max_tokens=32,
                                                 speculative=SpeculativeSettings("mtp", 3)))
    finally:
        session.close()


@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
@pytest.mark.parametrize("layout", ["sidecar-renumbered", "sidecar-offset"])
def test_renumbered_and_offset_sidecars_are_repaired_from_the_targets_metadata(arch, layout, tmp_path):
    model = synth(arch, "mixed", seed=1)
    trunk = model.path("trunk")
    d = diagnose(trunk, model.path(layout))
    assert d.repairable, d.report()
    assert "made for a model with" not in d.report()
    fixed = repair(trunk, model.path(layout), tmp_path / "fixed.gguf")
    facts = read_facts(fixed)
    assert facts.trunk_layers == read_facts(trunk).trunk_layers and diagnose(trunk, fixed).ok
    want, got = _run(trunk, model.path("sidecar")), _run(trunk, fixed)
    assert got.tokens == want.tokens and got.accepted_per_round == want.accepted_per_round


def test_renumbering_rebuilds_per_layer_metadata_from_the_target(tmp_path):
    model = synth("step35")
    fixed = repair(model.path("trunk"), model.path("sidecar-renumbered"), tmp_path / "fixed.gguf")
    key = "step35.attention.sliding_window_pattern"
    assert read_header(fixed).metadata[key] == read_header(model.path("combined")).metadata[key]


# -- finding 3: a tensor stored twice under one name --------------------------------------------

@pytest.mark.parametrize("arch", ["glm4moe", "step35"])
def test_repair_keeps_one_copy_of_a_tensor_stored_twice(arch, tmp_path):
    model = synth(arch)
    trunk, broken = model.path("trunk"), model.path("sidecar-exact-duplicates")
    assert read_facts(broken).tensor_names.count(f"blk.{model.spec.dims.n_trunk}.nextn.enorm.weight") == 2
    d = diagnose(trunk, broken)
    assert d.repairable and "stored twice under one name" in d.report()
    with pytest.raises(SidecarMismatch, match="stored twice"):
        check_sidecar(read_facts(trunk), read_facts(broken))
    fixed = repair(trunk, broken, tmp_path / "fixed.gguf")
    assert diagnose(trunk, fixed).ok
    assert read_facts(fixed).tensor_count == read_facts(model.path("sidecar")).tensor_count
    assert "loaded with MTP" in prove(trunk, fixed)


def test_repair_refuses_two_different_copies_under_one_name(tmp_path):
    model = synth("glm4moe")
    broken = tmp_path / "differ.gguf"
    broken.write_bytes(model.path("sidecar-exact-duplicates").read_bytes())
    second = [t for t in read_header(broken).tensors if t.name == "blk.4.nextn.enorm.weight"][1]
    with broken.open("r+b") as f:
        f.seek(second.offset)
        f.write(b"\x00\x00\x00\x40" * 4)  # four weights set to 2.0
    with pytest.raises(RepairError, match="twice with different contents"):
        repair(model.path("trunk"), broken, tmp_path / "fixed.gguf")
    assert not (tmp_path / "fixed.gguf").exists() and not list(tmp_path.glob("*.partial"))


def test_the_cli_repairs_exact_duplicates_without_a_traceback(tmp_path, capsys):
    from engine.cli import main

    model = synth("glm4moe")
    out = tmp_path / "fixed.gguf"
    assert main(["models", "repair", str(model.path("trunk")), str(model.path("sidecar-exact-duplicates")),
                 "--out", str(out)]) == 0
    assert "loaded with MTP (single)" in capsys.readouterr().out


# -- finding 7: the live probe ----------------------------------------------------------------

def test_the_probe_warns_when_a_sidecar_that_fits_on_paper_is_never_accepted():
    from engine.store.doctor import run_probe

    own, other = synth("glm4moe"), synth("glm4moe", seed=1)  # same shapes and vocabulary, other weights
    trunk, foreign = own.path("trunk"), other.path("sidecar")
    d = diagnose(trunk, foreign)
    assert d.ok, d.report()
    probed = run_probe(d)
    assert probed.probe is not None and probed.probe.drafted >= 64 and probed.probe.acceptance < 0.05
    assert "its drafts are almost never accepted" in probed.report() and "another finetune" in probed.report()
    assert probed.warnings and not d.warnings  # the first diagnosis is left as it was

    good = run_probe(diagnose(trunk, own.path("sidecar")))
    assert good.probe.acceptance > 0.9 and not good.warnings, good.report()


def test_the_cli_doctor_probe_reports_acceptance(capsys):
    from engine.cli import main

    model, other = synth("glm4moe"), synth("glm4moe", seed=1)
    assert main(["models", "doctor", str(model.path("trunk")), str(other.path("sidecar")), "--probe"]) == 0
    assert "almost never accepted" in capsys.readouterr().out


# -- every architecture the engine claims ------------------------------------------------------

REPAIRABLE = ("sidecar-relative", "sidecar-duplicates", "sidecar-exact-duplicates", "sidecar-renumbered",
              "sidecar-offset")


@pytest.mark.parametrize("arch", ALL_MTP_ARCHS)
def test_every_architecture_sidecar_fits_and_its_broken_variants_are_judged_alike(arch):
    model = synth(arch, "random")
    trunk = model.path("trunk")
    target = read_facts(trunk)
    fits = {"sidecar", "combined"}
    if not any(".nextn.shared_head_" in n for n in read_facts(model.path("sidecar")).tensor_names):
        fits.add("sidecar-duplicates")  # no shared_head tensors: nothing stored again under legacy names
    for layout in CHECKED:
        d = diagnose(trunk, model.path(layout))
        assert d.ok == _loads(target, read_facts(model.path(layout))), (layout, d.report())
        assert d.ok == (layout in fits), (layout, d.report())
        # qwen4exp's duplicate head mixer loads here but not in other llama.cpp builds: Repair offers the fix
        warned = arch == "qwen4exp" and layout == "sidecar-duplicates"
        assert d.repairable == (layout in set(REPAIRABLE) - fits or warned), (layout, d.report())


@pytest.mark.parametrize("arch", ALL_MTP_ARCHS)
def test_every_architecture_renumbered_sidecar_with_a_duplicate_is_repaired_and_drafts(arch, tmp_path):
    model = synth(arch, "random")
    trunk = model.path("trunk")
    for layout in ("sidecar-renumbered", "sidecar-exact-duplicates"):
        fixed = repair(trunk, model.path(layout), tmp_path / f"{layout}.gguf")
        assert diagnose(trunk, fixed).ok
        assert "loaded with MTP" in prove(trunk, fixed)


# -- the three architectures finding 2 was about -----------------------------------------------

@pytest.mark.parametrize("arch", ["deepseek32", "glm-dsa", "deepseek4"])
def test_dsa_and_deepseek4_sidecars_are_accepted_repaired_and_loaded(arch, tmp_path):
    try:
        model = synth(arch, "random")
    except ValueError as exc:
        pytest.skip(f"the synthetic generator does not make {arch} yet: {exc}")
    trunk = model.path("trunk")
    check_sidecar(read_facts(trunk), read_facts(model.path("sidecar")))
    assert diagnose(trunk, model.path("sidecar")).ok
    fixed = repair(trunk, model.path("sidecar-relative"), tmp_path / "fixed.gguf")
    assert diagnose(trunk, fixed).ok
    for side in (model.path("sidecar"), fixed):
        assert _run(trunk, side).stats.drafted > 0


def test_a_mimo2_mtp_block_with_split_attention_is_refused_before_it_aborts_a_draft():
    # llama.cpp's mimo2 MTP graph asserts a fused attn_qkv at the first draft;
    # no loader checks it, so a split export would load and then kill the worker.
    import dataclasses

    from engine.errors import SpeculativeUnavailable
    from engine.gguf.facts import read_facts
    from engine.gguf.sidecar import assess, check_target_has_mtp

    model = synth("mimo2", "random", n_heads=1)
    combined, side = read_facts(model.path("combined")), read_facts(model.path("sidecar"))
    check_target_has_mtp(combined)
    assert not assess(read_facts(model.path("trunk")), side).errors

    def split(facts):
        names = tuple(n for n in facts.tensor_names if not n.endswith(f"blk.{facts.block_count - 1}.attn_qkv.weight"))
        last = facts.block_count - 1
        return dataclasses.replace(facts, tensor_names=names + tuple(f"blk.{last}.attn_{p}.weight" for p in "qkv"))

    with pytest.raises(SpeculativeUnavailable, match="fused"):
        check_target_has_mtp(split(combined))
    verdict = assess(read_facts(model.path("trunk")), split(side))
    assert any("fused" in f.text for f in verdict.errors)

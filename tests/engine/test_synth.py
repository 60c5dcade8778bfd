"""Synthetic models load in the real llama.cpp and behave as designed; the
derived architectures' tensor lists come from llama.cpp's own loader."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.gguf.facts import read_facts
from engine.runtime import Model
from engine.synth import SynthSpec, derived, probe
from engine.synth.spec import DERIVED_ARCHITECTURES
from engine.synth.tokenizer import build_vocabulary
from tests.engine.conftest import ARCHS, heads_for, synth


@pytest.mark.parametrize("arch", ARCHS)
def test_oracle_model_greedy_follows_its_token_map_for_200_tokens(arch):
    model = synth(arch)
    maps = model.maps
    session = Session(LoadOptions(path=str(model.path()), n_ctx=512, mtp=False))
    try:
        prompt = session.model.tokenize(" the river")
        result = generate(session, GenerateRequest(prompt=" the river", max_tokens=200))
        expected, token = [], prompt[-1]
        for _ in range(200):
            token = maps.f[token]
            expected.append(token)
        assert result.tokens == expected
    finally:
        session.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_random_model_output_is_deterministic_across_runs(arch):
    path = str(synth(arch, "random").path())
    outs = []
    for _ in range(2):
        session = Session(LoadOptions(path=path, n_ctx=512, mtp=False))
        try:
            outs.append(generate(session, GenerateRequest(prompt=" a b", max_tokens=64)).tokens)
        finally:
            session.close()
    assert outs[0] == outs[1] and len(set(outs[0])) >= 2


@pytest.mark.parametrize("arch", ARCHS)
def test_every_layout_reads_back_with_the_right_mtp_facts(arch):
    model = synth(arch)
    combined = read_facts(model.path("combined"))
    trunk = read_facts(model.path("trunk"))
    sidecar = read_facts(model.path("sidecar"))
    sharded = read_facts(model.path("sharded"))
    n = heads_for(arch)
    assert (combined.layout, combined.nextn_layers, combined.trunk_layers) == ("combined", n, 4)
    assert (trunk.layout, trunk.nextn_layers, trunk.block_count) == ("plain", 0, 4)
    assert (sidecar.layout, sidecar.nextn_layers) == ("mtp-only", n)
    assert sharded.split_count == 2 and sharded.layout == "combined"
    assert sharded.tensor_count == combined.tensor_count
    for path in (model.path("combined"), model.path("trunk"), model.path("sharded")):
        with Model(path, load_mtp=path != model.path("trunk")) as m:
            assert m.n_layer == 4


def test_missing_shard_is_named(tmp_path):
    model = synth("glm4moe")
    first = model.path("sharded")
    lone = tmp_path / first.name
    lone.write_bytes(first.read_bytes())
    with pytest.raises(Exception, match="00002-of-00002.gguf is missing"):
        read_facts(lone)


# How llama.cpp itself fails on the broken sidecars users meet (seed 002).
# Loaded in a child process: a native abort must not end the test run.
NATIVE_FAILURES = {
    "sidecar-relative": "check_tensor_dims: tensor 'blk.1.attn_norm.weight' not found",
    "sidecar-duplicates": "wrong number of tensors",
    "sidecar-missing": "tensor 'blk.4.nextn.hnorm.weight' not found",
}


@pytest.mark.parametrize("layout, message", sorted(NATIVE_FAILURES.items()))
def test_broken_sidecars_fail_in_llama_cpp_the_way_users_report(layout, message):
    path = synth("glm4moe").path(layout)
    code = (
        "from engine.runtime import Model\n"
        "try:\n"
        f"    Model({str(path)!r}, load_mtp=True)\n"
        "    print('LOADED')\n"
        "except Exception as e:\n"
        "    print('FAILED', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert "FAILED" in out and message in out, out


# -- architectures derived from llama.cpp's loader (engine.synth.derived) ------


@pytest.mark.parametrize("arch", DERIVED_ARCHITECTURES)
def test_derived_layouts_read_back_with_the_right_mtp_facts(arch):
    model = synth(arch, "random")
    combined, trunk, sidecar = (read_facts(model.path(layout)) for layout in ("combined", "trunk", "sidecar"))
    n = heads_for(arch)
    assert (combined.layout, combined.nextn_layers, combined.trunk_layers) == ("combined", n, 4)
    assert (trunk.layout, trunk.nextn_layers, trunk.block_count) == ("plain", 0, 4)
    assert (sidecar.layout, sidecar.nextn_layers, sidecar.trunk_layers) == ("mtp-only", n, 4)
    # the sidecar holds the MTP blocks at absolute indices and the globals, no trunk block
    assert {int(t.split(".")[1]) for t in sidecar.tensor_names if t.startswith("blk.")} == set(range(4, 4 + n))
    # (qwen4exp's output_hc_* is the trunk's own mixer: its head carries blk.N.nextn.hc_head_*)
    trunk_only = ("output_hc_",) if arch == "qwen4exp" else ()
    assert {t for t in combined.tensor_names if not t.startswith(("blk.", *trunk_only))} <= set(sidecar.tensor_names)
    with Model(model.path("combined"), load_mtp=True) as m:
        assert (m.n_layer, m.n_layer_nextn) == (4, n)
    with Model(model.path("trunk")) as m:
        assert (m.n_layer, m.n_layer_nextn) == (4, 0)


def test_the_probe_asks_llama_cpp_once_per_engine_build(monkeypatch):
    spec = SynthSpec(arch="deepseek2", weights="random")
    result = derived.probe_spec(spec)
    names = result.names()
    assert "blk.0.attn_kv_a_mqa.weight" in names and "blk.4.nextn.eh_proj.weight" in names
    monkeypatch.setattr(probe, "_run_child", lambda *a: pytest.fail("probed again"))
    assert derived.probe_spec(spec) == result


@pytest.mark.parametrize("arch, change, message", [
    ("deepseek2", {"attention.kv_lora_rank": None}, "key not found in model: deepseek2.attention.kv_lora_rank"),
    # a native abort (GGML_ASSERT) in the child reaches us as an exception with its message
    ("nemotron_h_moe", {"attention.head_count": [0, 0, 4, 0, 4]}, r"GGML_ASSERT\(t_meta.ne\[dim\] >= 1\)"),
])
def test_metadata_llama_cpp_refuses_is_reported_with_its_reason(arch, change, message):
    keys = derived.metadata(SynthSpec(arch=arch, weights="random"))
    for key, value in change.items():
        if value is None:
            del keys[key]
        else:
            keys[key] = value
    with pytest.raises(probe.ProbeError, match=message):
        probe.probe(arch, keys, build_vocabulary(512))


def test_derived_architectures_have_no_oracle_weights():
    with pytest.raises(ValueError, match="random and mixed"):
        SynthSpec(arch="deepseek4")


def test_synth_command_writes_every_architecture(capsys):
    from engine.cli import main

    assert main(["synth", "--arch", "deepseek4", "--layout", "trunk", "--layout", "sidecar"]) == 0
    trunk, side = capsys.readouterr().out.split()
    assert "deepseek4-tiny-random" in trunk and read_facts(side).layout == "mtp-only"
    assert main(["synth", "--arch", "hy_v3", "--weights", "mixed", "--json"]) == 0
    assert '"n_heads": 2' in capsys.readouterr().out


def test_effective_maps_are_the_same_computed_in_chunks_and_at_once():
    import numpy as np

    from engine.synth.weights import effective_map

    rng = np.random.default_rng(3)
    head, embd = rng.standard_normal((700, 16)), rng.standard_normal((700, 16))
    whole = [int(x) for x in (embd[:650] @ head.T).argmax(axis=1)]
    assert effective_map(head, embd, 650, chunk=64) == whole  # 650 is not a multiple of the chunk
    assert len(set(whole)) > 100


def test_a_real_vocabulary_keeps_every_token_but_maps_only_the_first_4094():
    vocab = build_vocabulary(151_936)
    assert len(vocab.tokens) == 151_936 and vocab.n_normal == 151_934
    assert vocab.n_active == 4094 == build_vocabulary(4096).n_active
    assert build_vocabulary(512).n_active == 510

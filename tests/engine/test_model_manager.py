"""The model manager: hub search and files on a loopback stand-in for the hub,
resumable verified downloads, the sidecar doctor, repair, and memory fit."""

from __future__ import annotations

import hashlib

import pytest

from engine.store import download as dl
from engine.store import hub
from engine.store.doctor import diagnose
from engine.store.fit import estimate, estimates, measure
from engine.store.repair import RepairError, prove, repair
from tests.engine.conftest import synth
from tests.fake_hub import FakeHub

REPO = "test/Synth-MTP-GGUF"


@pytest.fixture()
def fake_hub(monkeypatch):
    model = synth("glm4moe")
    files = {
        "Synth-Q8_0.gguf": model.path("trunk"),
        "mtp-Synth-Q8_0.gguf": model.path("sidecar"),
        "Synth-F16-00001-of-00002.gguf": model.path("sharded"),
        "Synth-F16-00002-of-00002.gguf": model.path("sharded").with_name("sharded-00002-of-00002.gguf"),
    }
    with FakeHub({REPO: files, "other/unrelated": {}}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server, files


def test_search_finds_gguf_repositories(fake_hub):
    server, _ = fake_hub
    assert [r.repo_id for r in hub.search("synth", endpoint=server.url)] == [REPO]


def test_files_are_grouped_by_quantization_with_shards_and_the_sidecar_suggested(fake_hub):
    server, files = fake_hub
    groups = hub.repo_files(REPO, endpoint=server.url)
    by_quant = {(g.quant, g.is_mtp): g for g in groups}
    f16 = by_quant[("F16", False)]
    assert f16.shards == 2 and f16.size == sum(files[n].stat().st_size for n in f16.files)
    assert by_quant[("Q8_0", True)].files == ["mtp-Synth-Q8_0.gguf"]
    assert hub.suggest_sidecar(REPO, groups) == (REPO, "mtp-Synth-Q8_0.gguf")


def test_catalog_suggests_sidecars_for_known_families():
    assert hub.suggest_sidecar("unsloth/Qwen3.8-Flash-Next-GGUF", [])[0] == "dzannotti/Qwen3.8-Flash-Next-MTP-GGUF"


def test_a_download_killed_half_way_resumes_without_starting_over(fake_hub, tmp_path):
    server, files = fake_hub
    size = files["Synth-Q8_0.gguf"].stat().st_size
    server.drop_after["Synth-Q8_0.gguf"] = size // 2
    with pytest.raises(dl.DownloadError, match="resumes next time"):
        dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url)
    partial = tmp_path / "Synth-Q8_0.gguf.partial"
    assert partial.stat().st_size == size // 2
    seen = []
    path = dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url, progress=seen.append)
    assert server.range_requests == [("Synth-Q8_0.gguf", f"bytes={size // 2}-")]
    assert seen[0].resumed_from == size // 2 and seen[-1].done == size
    assert path.read_bytes() == files["Synth-Q8_0.gguf"].read_bytes() and not partial.exists()


def test_a_corrupt_download_is_discarded_with_a_clear_error(fake_hub, tmp_path):
    server, _ = fake_hub
    server.corrupt.add("mtp-Synth-Q8_0.gguf")
    with pytest.raises(dl.DownloadError, match="arrived corrupt"):
        dl.download(REPO, "mtp-Synth-Q8_0.gguf", tmp_path, endpoint=server.url)
    assert not list(tmp_path.iterdir())


def test_not_enough_disk_space_is_refused_before_downloading(fake_hub, tmp_path, monkeypatch):
    server, _ = fake_hub
    monkeypatch.setattr(dl.shutil, "disk_usage", lambda _p: type("U", (), {"free": 1000})())
    with pytest.raises(dl.DiskFullError, match="Free some space"):
        dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url)


def test_every_shard_downloads_and_the_set_reads_as_one_model(fake_hub, tmp_path):
    server, files = fake_hub
    for name in ("Synth-F16-00001-of-00002.gguf", "Synth-F16-00002-of-00002.gguf"):
        p = dl.download(REPO, name, tmp_path, endpoint=server.url)
        assert hashlib.sha256(p.read_bytes()).digest() == hashlib.sha256(files[name].read_bytes()).digest()
    from engine.gguf.facts import read_facts

    assert read_facts(tmp_path / "Synth-F16-00001-of-00002.gguf").layout == "combined"


@pytest.mark.parametrize("arch", ["glm4moe", "step35", "qwen35"])
def test_doctor_accepts_a_good_pair_and_explains_each_broken_sidecar(arch):
    model = synth(arch)
    trunk = model.path("trunk")
    assert diagnose(trunk, model.path("sidecar")).ok
    relative = diagnose(trunk, model.path("sidecar-relative"))
    assert relative.repairable and "relative" in relative.report()
    dupes = diagnose(trunk, model.path("sidecar-duplicates"))
    assert dupes.repairable and "legacy duplicate names" in dupes.report()
    missing = diagnose(trunk, model.path("sidecar-missing"))
    assert not missing.ok and not missing.repairable and "nextn.hnorm" in missing.report()
    other = diagnose(trunk, model.path("sidecar-other-embd"))
    assert not other.repairable and "hidden size (n_embd_out) 128; this target has hidden size (n_embd_out) 64" in (
        other.report())


@pytest.mark.parametrize("layout", ["sidecar-relative", "sidecar-duplicates"])
def test_repair_writes_a_copy_that_the_engine_loads_and_drafts_with(layout, tmp_path):
    model = synth("step35", "oracle", agree=1.0)
    fixed = repair(model.path("trunk"), model.path(layout), tmp_path / "fixed.gguf")
    assert diagnose(model.path("trunk"), fixed).ok
    assert "loaded with MTP (chained)" in prove(model.path("trunk"), fixed)


def test_repair_refuses_what_it_cannot_fix():
    model = synth("glm4moe")
    with pytest.raises(RepairError, match="cannot fix"):
        repair(model.path("trunk"), model.path("sidecar-other-vocab"))
    with pytest.raises(RepairError, match="nothing to repair"):
        repair(model.path("trunk"), model.path("sidecar"))


@pytest.mark.parametrize("arch", ["glm4moe", "step35", "qwen35", "qwen3next"])
@pytest.mark.parametrize("n_ctx", [2048, 8192])
def test_memory_estimate_is_within_15_percent_of_what_llama_cpp_allocates(arch, n_ctx):
    path = synth(arch).path()
    est = estimate(path, n_ctx=n_ctx)
    allocated = sum(measure(path, n_ctx=n_ctx).values()) * 2**20
    assert allocated > 0
    loaded = est.total - est.checkpoints  # (host copies taken later, as replies go)
    assert abs(loaded - allocated) / allocated < 0.15, (est.lines(), allocated)


@pytest.mark.parametrize("swa_full", [False, True], ids=["window", "full"])
def test_memory_estimate_of_the_built_in_sliding_window_model_follows_its_window_cache(default_model, swa_full):
    """Gemma 3 lists no pattern of windowed layers (llama.cpp knows it: 5 of every 6); without ``swa_full``
    they keep their window's cells only, a fifth of the KV cache at 32k tokens."""
    est = estimate(default_model, n_ctx=32768, swa_full=swa_full)
    allocated = sum(measure(default_model, n_ctx=32768, swa_full=swa_full).values()) * 2**20
    assert abs(est.total - est.checkpoints - allocated) / allocated < 0.15, (est.lines(), allocated)
    if not swa_full:
        assert est.kv_cache * 4 < estimate(default_model, n_ctx=32768, swa_full=True).kv_cache


@pytest.mark.parametrize("kv_unified", [True, False], ids=["one-pool", "pool-each"])
def test_a_sliding_window_cache_of_several_sequences_is_estimated_as_its_pools_hold_it(default_model, kv_unified):
    """Eight sequences of 4,096 tokens on the built-in Gemma 3 (a window of 512): one pool's windowed layers
    hold every sequence's window and one ubatch; a pool each holds its own window and ubatch, about 1.8×
    the cells (LoadOptions.kv_unified)."""
    n_seq = 8
    est = estimates(default_model, [4096 * n_seq], n_seqs=[n_seq], available=1, kv_unified=kv_unified)[0]
    allocated = measure(default_model, n_ctx=4096, n_seq=n_seq, kv_unified=kv_unified)
    assert abs(est.kv_cache - allocated["KV"] * 2**20) / (allocated["KV"] * 2**20) < 0.1, (est.lines(), allocated)
    total = sum(allocated.values()) * 2**20
    assert abs(est.total - est.checkpoints - total) / total < 0.15, (est.lines(), allocated)


@pytest.mark.parametrize("n_seq", [1, 4])
def test_a_hybrids_recurrent_state_is_estimated_for_every_sequence(n_seq):
    """llama.cpp keeps one recurrent state (and with MTP its rollback snapshots) per sequence: four sequences
    hold four times one's."""
    path = synth("qwen35").path()
    est = estimates(path, [2048 * n_seq], n_seqs=[n_seq], available=1)[0]
    allocated = measure(path, n_ctx=2048, n_seq=n_seq)["RS"] * 2**20
    assert abs(est.recurrent - allocated) / allocated < 0.15, (est.lines(), allocated)


@pytest.mark.parametrize("arch", ["qwen35", "default"])
def test_the_estimate_counts_the_checkpoints_each_sequence_keeps(arch, default_model):
    """A hybrid's checkpoints copy its recurrent state, a window-only cache's its window's cells, two per
    sequence in host memory: the estimate holds what a real one takes."""
    from engine.generation.checkpoints import KEEP
    from engine.generation.generator import GenerateRequest, generate
    from engine.generation.session import LoadOptions, Session

    path = str(default_model if arch == "default" else synth(arch).path())
    est = estimates(path, [4096 * 2], n_seqs=[2], available=1)[0]
    per_copy = est.checkpoints / (KEEP * 2)
    with Session(LoadOptions(path=path, n_ctx=4096)) as session:
        prompt = " the river model and the old bridge" * (150 if arch == "default" else 100)  # 1,200 / 3,300 tokens
        generate(session, GenerateRequest(prompt=prompt, max_tokens=2))
        copy = session.prefix.checkpoints.latest
        assert copy is not None and copy.state is not None
        taken = len(copy.state)
    assert abs(taken - per_copy) / per_copy < 0.15, (taken, est.lines())


def test_a_hybrid_with_windowed_layers_is_estimated_with_their_whole_cache():
    """deepseek4 is a hybrid to llama.cpp (llm_arch_is_hybrid) with no ssm.* keys: the session loads it keeping
    every cell of its windowed layers (their checkpoints are for its recurrent state), and the estimate's KV
    cache is that, not a window's (a fifth of it at 8k tokens)."""
    path = synth("deepseek4", "random").path()
    est = estimate(path, n_ctx=8192)
    allocated = measure(path, n_ctx=8192)["KV"] * 2**20
    assert abs(est.kv_cache - allocated) / allocated < 0.15, (est.lines(), allocated)


def test_a_window_key_windows_no_layer_where_llama_cpp_loads_no_pattern():
    """llama.cpp windows a layer only where the architecture loads a pattern (or the GGUF lists one); Phi-3
    writes a sliding_window that llama.cpp ignores, and an architecture it does not know gets none: sizing
    their layers by the window would promise memory the load then takes."""
    from engine.store.fit import _window_layers

    assert _window_layers("phi3", {"phi3.attention.sliding_window": 2047}, 32) == [False] * 32
    assert _window_layers("gemma3", {"gemma3.attention.sliding_window": 512}, 12) == [True] * 5 + [False] + (
        [True] * 5 + [False])
    listed = {"step35.attention.sliding_window": 16, "step35.attention.sliding_window_pattern": [True, False]}
    assert _window_layers("step35", listed, 3) == [True, False, False]
    assert _window_layers("deepseek4", {"deepseek4.attention.sliding_window": 128}, 4) == [True] * 4
    # exaone4 has a window at 64 layers (its 32B) only
    assert _window_layers("exaone4", {"exaone4.attention.sliding_window": 4096, "exaone4.block_count": 30},
                          30) == [False] * 30
    assert _window_layers("exaone4", {"exaone4.attention.sliding_window": 4096, "exaone4.block_count": 64},
                          8) == [True] * 3 + [False] + [True] * 3 + [False]


def test_fit_verdicts():
    path = synth("glm4moe").path()
    assert estimate(path, available=10**12).verdict == "fits"
    assert estimate(path, available=1).verdict == "won't fit"
    total = estimate(path, available=10**12).total
    assert estimate(path, available=int(total * 1.1)).verdict == "tight"


def test_resuming_sends_only_the_missing_bytes(fake_hub, tmp_path):
    server, files = fake_hub
    size = files["Synth-Q8_0.gguf"].stat().st_size
    server.drop_after["Synth-Q8_0.gguf"] = size // 2
    with pytest.raises(dl.DownloadError):
        dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url)
    dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url)
    assert server.bytes_served["Synth-Q8_0.gguf"] == size  # half, then the other half: nothing twice


def test_gated_and_missing_files_get_clear_errors(fake_hub, tmp_path):
    server, _ = fake_hub
    with pytest.raises(dl.DownloadError, match="is not in test/Synth-MTP-GGUF"):
        dl.download(REPO, "nope-Q4_K_M.gguf", tmp_path, endpoint=server.url)
    server.token = "hf_secret"
    with pytest.raises(dl.DownloadError, match="needs an access token"):
        dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url)
    path = dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url, token="hf_secret")
    assert path.exists() and not list(tmp_path.glob("*.partial"))


def test_a_missing_shard_on_the_hub_leaves_the_model_incomplete_and_says_so(fake_hub, tmp_path):
    server, files = fake_hub
    dl.download(REPO, "Synth-F16-00001-of-00002.gguf", tmp_path, endpoint=server.url)
    del server.repos[REPO]["Synth-F16-00002-of-00002.gguf"]
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.download(REPO, "Synth-F16-00002-of-00002.gguf", tmp_path, endpoint=server.url)
    from engine.errors import ModelFileError
    from engine.gguf.facts import read_facts

    with pytest.raises(ModelFileError, match="00002-of-00002.gguf is missing"):
        read_facts(tmp_path / "Synth-F16-00001-of-00002.gguf")


def test_cancel_on_a_slow_server_keeps_the_part_for_later(fake_hub, tmp_path):
    import threading

    server, files = fake_hub
    server.slow_chunk_s = 0.05
    cancel = threading.Event()
    seen = []

    def progress(p: dl.Progress) -> None:
        seen.append(p.done)
        if len(seen) == 3:
            cancel.set()

    with pytest.raises(dl.DownloadCancelled, match="resumes from there"):
        dl.download(REPO, "Synth-Q8_0.gguf", tmp_path, endpoint=server.url, progress=progress, cancel=cancel)
    partial = tmp_path / "Synth-Q8_0.gguf.partial"
    assert 0 < partial.stat().st_size < files["Synth-Q8_0.gguf"].stat().st_size
    assert not (tmp_path / "Synth-Q8_0.gguf").exists()


def test_a_file_name_that_escapes_the_models_folder_is_refused(fake_hub, tmp_path):
    server, _ = fake_hub
    with pytest.raises(dl.DownloadError, match="leave the models folder"):
        dl.download(REPO, "../../../etc/evil.gguf", tmp_path / "models", endpoint=server.url)
    assert not list(tmp_path.rglob("*evil*"))


@pytest.mark.parametrize("layout", ["sidecar-relative", "sidecar-duplicates"])
def test_a_repaired_sidecar_drafts_exactly_like_the_correct_export(layout, tmp_path):
    from engine.generation.generator import GenerateRequest, generate
    from engine.generation.session import LoadOptions, Session
    from engine.speculative.settings import SpeculativeSettings

    model = synth("glm4moe", "mixed", seed=1)
    fixed = repair(model.path("trunk"), model.path(layout), tmp_path / "fixed.gguf")
    runs = []
    for side in (model.path("sidecar"), fixed):
        session = Session(LoadOptions(path=str(model.path("trunk")), sidecar=str(side), n_ctx=256))
        try:
            runs.append(generate(session, GenerateRequest(prompt=" the river", max_tokens=40,
                                                          speculative=SpeculativeSettings("mtp", 3))))
        finally:
            session.close()
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].accepted_per_round == runs[1].accepted_per_round

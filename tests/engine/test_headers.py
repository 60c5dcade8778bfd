"""Hostile GGUF headers (issue 17, items 5 and 6): a count that would allocate
gigabytes, a value of the wrong type, arrays nested thousands deep. Each file is
a synthetic sidecar with one thing changed; ``mtp-studio info``, ``models
doctor`` and ``models list`` must each end with a clean error (an exit code and
a sentence naming the key, never a traceback, a MemoryError or a RecursionError)
within two seconds.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.cli import main
from engine.store import library
from tests import gguf_mutate as G
from tests.engine.conftest import synth

A = "glm4moe"
QUICK = 2.0  # seconds: each command on each hostile file
Mutation = Callable[[G.Gguf], G.Gguf]


def _kv(key: str, encoded: bytes) -> Mutation:
    return lambda g: g.with_kv(key, encoded)


def _two(first: Mutation, second: Mutation) -> Mutation:
    return lambda g: second(first(g))


def _counts(n_tensors: int | None = None, n_kv: int | None = None) -> Mutation:
    """The count fields lie; the entries after them are the real ones."""
    return lambda g: dataclasses.replace(g, n_tensors=n_tensors, n_kv=n_kv)


def _huge_string_array(g: G.Gguf) -> G.Gguf:
    """An array that claims 2^60 strings and holds three."""
    raw = G.array(G.STRING, ["a", "b", "c"])
    return g.with_kv("fuzz.strings", raw[:8] + (2**60).to_bytes(8, "little") + raw[16:])


# (id, mutation, a word the error must contain)
MUTATIONS: list[tuple[str, Mutation, str]] = [
    ("nextn-1e9", _kv(f"{A}.nextn_predict_layers", G.value(G.UINT32, 10**9)), "nextn_predict_layers"),
    ("nextn-and-blocks-1e9", _two(_kv(f"{A}.nextn_predict_layers", G.value(G.UINT32, 10**9)),
                                  _kv(f"{A}.block_count", G.value(G.UINT32, 10**9))), "block_count"),
    ("nextn-and-blocks-1e7", _two(_kv(f"{A}.nextn_predict_layers", G.value(G.UINT64, 10**7)),
                                  _kv(f"{A}.block_count", G.value(G.UINT64, 10**7))), "block_count"),
    ("nextn-over-blocks", _kv(f"{A}.nextn_predict_layers", G.value(G.UINT32, 6)), "nextn_predict_layers"),
    ("blocks-string", _kv(f"{A}.block_count", G.value(G.STRING, "five")), "block_count"),
    ("blocks-nan", _kv(f"{A}.block_count", G.value(G.FLOAT32, math.nan)), "block_count"),
    ("blocks-array", _kv(f"{A}.block_count", G.array(G.UINT32, [5, 5])), "block_count"),
    ("blocks-negative", _kv(f"{A}.block_count", G.value(G.INT32, -5)), "block_count"),
    ("embd-string", _kv(f"{A}.embedding_length", G.value(G.STRING, "64")), "embedding_length"),
    ("split-string", _kv("split.count", G.value(G.STRING, "two")), "split.count"),
    ("split-nan", _kv("split.count", G.value(G.FLOAT64, math.nan)), "split.count"),
    ("split-array", _kv("split.count", G.array(G.UINT16, [2])), "split.count"),
    ("split-1e9", _kv("split.count", G.value(G.UINT32, 10**9)), "split.count"),
    ("alignment-string", _kv("general.alignment", G.value(G.STRING, "32")), "general.alignment"),
    ("alignment-nan", _kv("general.alignment", G.value(G.FLOAT32, math.nan)), "general.alignment"),
    ("alignment-array", _kv("general.alignment", G.array(G.UINT32, [32])), "general.alignment"),
    ("alignment-zero", _kv("general.alignment", G.value(G.UINT32, 0)), "general.alignment"),
    ("alignment-odd", _kv("general.alignment", G.value(G.UINT32, 48)), "general.alignment"),
    ("bos-string", _kv("tokenizer.ggml.bos_token_id", G.value(G.STRING, "<s>")), "bos_token_id"),
    ("bos-nan", _kv("tokenizer.ggml.bos_token_id", G.value(G.FLOAT32, math.nan)), "bos_token_id"),
    ("bos-array", _kv("tokenizer.ggml.bos_token_id", G.array(G.UINT32, [1])), "bos_token_id"),
    ("eos-negative", _kv("tokenizer.ggml.eos_token_id", G.value(G.INT64, -1)), "eos_token_id"),
    ("arch-integer", _kv("general.architecture", G.value(G.UINT32, 7)), "general.architecture"),
    ("tokens-integers", _kv("tokenizer.ggml.tokens", G.array(G.UINT32, [1, 2, 3])), "tokenizer.ggml.tokens"),
    ("template-integer", _kv("tokenizer.chat_template", G.value(G.UINT8, 1)), "chat_template"),
    ("nested-3000", _kv("fuzz.nested", G.nested_array(3000)), "fuzz.nested"),
    ("strings-2^60", _huge_string_array, "fuzz.strings"),
    ("tensors-1e7", _counts(n_tensors=10**7), "tensors"),
    ("tensors-2^64", _counts(n_tensors=2**64 - 1), "tensors"),
    ("keys-1e6", _counts(n_kv=10**6 - 1), "keys"),
]


@pytest.fixture(scope="module")
def model():
    return synth("glm4moe")


@pytest.fixture(scope="module")
def sidecar(model) -> G.Gguf:
    return G.parse(model.path("sidecar"))


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    start = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - start
    out = capsys.readouterr()
    return code, out.out + out.err, elapsed


@pytest.fixture()
def only_this_library(tmp_path, monkeypatch):
    """``models list`` scans tmp_path/lib alone (no hub cache, no remembered folders)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    monkeypatch.setattr(library, "hub_cache", lambda: tmp_path / "no-hub-cache")
    monkeypatch.setattr(library, "folders", lambda: [lib])
    monkeypatch.setenv("MTP_STUDIO_DATA_DIR", str(tmp_path / "data"))
    return lib


@pytest.mark.parametrize("mutate, word", [(m, w) for _, m, w in MUTATIONS], ids=[i for i, _, _ in MUTATIONS])
def test_a_hostile_header_ends_every_command_with_a_clean_error(mutate, word, model, sidecar, only_this_library,
                                                                capsys):
    bad = mutate(sidecar).write(only_this_library / "mtp-bad.gguf")

    code, text, elapsed = _run(["info", str(bad)], capsys)
    assert (code, elapsed < QUICK) == (2, True), text
    assert word in text and text.startswith("error: ") and "Traceback" not in text

    code, text, elapsed = _run(["models", "doctor", str(model.path()), str(bad)], capsys)
    assert (code, elapsed < QUICK) == (2, True), text
    assert word in text and text.startswith("error: ")

    good = only_this_library / "good.gguf"
    good.write_bytes(model.path("sidecar").read_bytes())
    code, text, elapsed = _run(["models", "list"], capsys)
    assert (code, elapsed < QUICK) == (0, True), text
    assert f"{bad}\n    unreadable: " in text and word in text
    assert f"{good}\n    {A}, " in text  # the good file is still listed


@pytest.mark.parametrize("key, encoded, found, expected", [
    (f"{A}.block_count", G.value(G.STRING, "five"), "string", "an integer"),
    ("general.alignment", G.value(G.FLOAT32, math.nan), "float32", "uint32"),
    ("tokenizer.ggml.bos_token_id", G.array(G.UINT32, [1]), "array of uint32", "an integer"),
], ids=["string", "float", "array"])
def test_a_wrong_type_is_named_with_the_key_the_type_found_and_the_type_expected(key, encoded, found, expected,
                                                                                 sidecar, tmp_path):
    from engine.errors import ModelFileError
    from engine.gguf.facts import read_facts

    bad = sidecar.with_kv(key, encoded).write(tmp_path / "bad.gguf")
    with pytest.raises(ModelFileError) as err:
        read_facts(bad)
    assert key in str(err.value) and found in str(err.value) and expected in str(err.value)


def _many_tensors(sidecar: G.Gguf, n: int, n_misshapen: int) -> G.Gguf:
    """The sidecar plus ``n`` one-element tensors: pairs stored under one name, and
    ``n_misshapen`` more copies of blk.4.nextn.enorm.weight with a wrong shape."""
    extra = [G.tensor_info(f"blk.4.nextn.extra{i // 2}.weight", (1,), 0, 0) for i in range(n - n_misshapen)]
    extra += [G.tensor_info("blk.4.nextn.enorm.weight", (1,), 0, 0)] * n_misshapen
    return G.Gguf(sidecar.version, sidecar.kv, sidecar.tensor_infos + extra, sidecar.data, sidecar.alignment)


def test_forty_thousand_tensors_are_judged_quickly_and_reported_briefly(model, sidecar, tmp_path, capsys):
    big = _many_tensors(sidecar, 40_000, 2_000).write(tmp_path / "mtp-big.gguf")

    code, text, elapsed = _run(["info", str(big)], capsys)
    assert (code, elapsed < QUICK) == (0, True), text[-2000:]

    code, text, elapsed = _run(["models", "doctor", str(model.path()), str(big)], capsys)
    assert (code, elapsed < QUICK) == (1, True), text[-2000:]
    assert "19001 tensor(s) stored twice under one name" in text
    assert len(text.splitlines()) < 40, f"{len(text.splitlines())} lines"  # a report, not a dump


def test_the_mtp_blocks_of_a_large_model_are_checked_without_building_lists(model, sidecar, tmp_path):
    """nextn at the cap: the doctor walks what the file holds, not range(block_count)."""
    from engine.gguf.facts import read_facts
    from engine.gguf.sidecar import assess

    big = sidecar.with_kv(f"{A}.block_count", G.value(G.UINT32, 4096)) \
        .with_kv(f"{A}.nextn_predict_layers", G.value(G.UINT32, 4096)).write(tmp_path / "mtp-4096.gguf")
    start = time.monotonic()
    a = assess(read_facts(model.path()), read_facts(big))
    assert time.monotonic() - start < QUICK
    assert a.errors and len(a.findings) < 20


def test_the_installed_command_exits_cleanly_on_a_hostile_file(sidecar, tmp_path):
    """The same through a real process: the exit code and stderr a user sees."""
    bad = sidecar.with_kv("fuzz.nested", G.nested_array(3000)).write(tmp_path / "bad.gguf")
    done = subprocess.run([sys.executable, "-m", "engine", "info", str(bad)], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: bad.gguf") and "fuzz.nested" in done.stderr


def test_one_file_the_reader_fails_on_unexpectedly_does_not_empty_the_library(model, only_this_library, monkeypatch):
    """A safety net under the reader: a bug on one file lists that file as unreadable, with the reason,
    and the scan goes on (the Models page shows nothing at all when the scan raises)."""
    good = only_this_library / "good.gguf"
    good.write_bytes(model.path("sidecar").read_bytes())
    odd = only_this_library / "odd.gguf"
    odd.write_bytes(b"GGUF")
    real = library.read_facts

    def flaky(path):
        if Path(path).name == "odd.gguf":
            raise ValueError("a reader bug")
        return real(path)

    monkeypatch.setattr(library, "read_facts", flaky)
    entries = {e.path.name: e for e in library.scan()}
    assert entries["good.gguf"].facts is not None
    assert entries["odd.gguf"].facts is None and "a reader bug" in entries["odd.gguf"].problem


@pytest.mark.parametrize("n_tensors", [10**7, 2**18 + 1], ids=["1e7", "cap+1"])
def test_a_tensor_count_the_bytes_could_hold_is_still_capped(n_tensors, tmp_path, capsys):
    """The campaign's file: zeros enough for every claimed entry (each a valid empty tensor), so only a
    hard cap stops the reader from building them (10^7: 24 s and 1.1 GB before)."""
    path = tmp_path / "many.gguf"
    with path.open("wb") as f:
        f.write(b"GGUF" + (3).to_bytes(4, "little") + n_tensors.to_bytes(8, "little") + (1).to_bytes(8, "little"))
        f.write(G.string("general.architecture") + G.value(G.STRING, "llama"))
        f.truncate(n_tensors * 24 + 4096)  # sparse: no disk written
    code, text, elapsed = _run(["info", str(path)], capsys)
    assert (code, elapsed < QUICK) == (2, True), text
    assert f"claims {n_tensors} tensors" in text


def test_more_nextn_layers_than_blocks_is_refused_from_the_header_not_by_llama_cpp(model, tmp_path):
    """llama.cpp asserts (the worker dies) on nextn_predict_layers > block_count; the header check
    refuses the file first. Run through the CLI and the worker, since the old way aborts the process."""
    bad = G.parse(model.path()).with_kv(f"{A}.nextn_predict_layers", G.value(G.UINT32, 6)) \
        .write(tmp_path / "over.gguf")
    done = subprocess.run([sys.executable, "-m", "engine", "chat", "hi", "--model", str(bad), "--mtp",
                           "--max-tokens", "1", "--ctx", "256"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 2, done.stderr[-2000:]
    assert "nextn_predict_layers (6) is more than its glm4moe.block_count (5)" in done.stderr


def test_the_memory_estimate_refuses_a_per_layer_size_of_the_wrong_type(model, tmp_path):
    # models fit reads per-layer head counts and key lengths as plain values
    from engine.errors import ModelFileError
    from engine.store import fit

    bad = G.parse(model.path("combined")).with_kv("glm4moe.attention.key_length", G.value(G.STRING, "wide"))
    bad = bad.write(tmp_path / "bad.gguf")
    with pytest.raises(ModelFileError, match="not a usable number"):
        fit.estimate(bad, n_ctx=256)

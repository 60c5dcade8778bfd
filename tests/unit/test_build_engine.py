"""The engine build script's choices: instruction sets, cache keys, patches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "build_engine.py"


@pytest.fixture()
def build_engine(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("build_engine_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "PATCH_DIR", tmp_path / "patches")
    (tmp_path / "patches").mkdir()
    monkeypatch.setenv("MTP_STUDIO_WHEEL_CACHE", str(tmp_path / "wheels"))
    return module


def test_cpu_build_never_goes_native_and_never_enables_amx(build_engine, monkeypatch):
    monkeypatch.setattr(build_engine.platform, "machine", lambda: "x86_64")
    args = build_engine.cmake_args("cpu")
    assert "-DGGML_NATIVE=OFF" in args
    assert not any("AMX" in a for a in args)
    assert all(a.endswith("=ON") or a.endswith("=OFF") for a in args)


def test_backends_add_their_switch(build_engine):
    assert "-DGGML_CUDA=ON" in build_engine.cmake_args("cuda")
    assert "-DGGML_METAL=ON" in build_engine.cmake_args("metal")
    assert "-DGGML_VULKAN=ON" in build_engine.cmake_args("vulkan")
    assert "-DGGML_HIP=ON" in build_engine.cmake_args("rocm")


def test_cache_key_changes_with_backend_and_patch_series(build_engine):
    cpu = build_engine.cache_key("cpu")
    assert cpu != build_engine.cache_key("cuda")
    assert cpu == build_engine.cache_key("cpu")
    (build_engine.PATCH_DIR / "0001-qwen4exp-mtp.patch").write_text("--- a/x\n+++ b/x\n")
    assert build_engine.cache_key("cpu") != cpu


def test_a_backend_patch_changes_that_backends_key_only_and_is_applied_after_the_common_series(build_engine):
    cpu, vulkan, cuda = (build_engine.cache_key(b) for b in ("cpu", "vulkan", "cuda"))
    (build_engine.PATCH_DIR / "0001-common.patch").write_text("--- a/x\n+++ b/x\n")
    (build_engine.PATCH_DIR / "vulkan").mkdir()
    (build_engine.PATCH_DIR / "vulkan" / "0001-headers.patch").write_text("--- a/y\n+++ b/y\n")
    assert [p.name for p in build_engine.patch_series("vulkan")] == ["0001-common.patch", "0001-headers.patch"]
    assert [p.name for p in build_engine.patch_series("cpu")] == ["0001-common.patch"]
    with_common = build_engine.cache_key("cpu")
    assert with_common != cpu and build_engine.cache_key("cuda") != cuda
    (build_engine.PATCH_DIR / "vulkan" / "0002-more.patch").write_text("--- a/z\n+++ b/z\n")
    assert build_engine.cache_key("cpu") == with_common  # a Vulkan-only patch leaves the CPU wheel alone
    assert build_engine.cache_key("vulkan") not in (vulkan, with_common)


def test_patches_are_applied_without_fuzz(build_engine, tmp_path):
    # a hunk whose outer context line differs applies "with fuzz 1" by default: refused here, not guessed
    vendor = tmp_path / "tree" / "vendor" / "llama.cpp"
    vendor.mkdir(parents=True)
    (vendor / "f.c").write_text("a\nb\nc\nd\ne\nf\ng\n")
    loose = "--- a/f.c\n+++ b/f.c\n@@ -1,7 +1,7 @@\n X\n b\n c\n-d\n+D\n e\n f\n g\n"
    (build_engine.PATCH_DIR / "0001-loose.patch").write_text(loose)
    with pytest.raises(SystemExit, match="0001-loose.patch does not apply"):
        build_engine.apply_patch_series(tmp_path / "tree")


def test_a_cached_wheel_is_found_and_a_partial_one_is_not(build_engine):
    folder = build_engine.cache_root() / build_engine.cache_key("cpu")
    folder.mkdir(parents=True)
    (folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl.partial").write_bytes(b"x")
    assert build_engine.cached_wheel("cpu") is None
    (folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"x")
    assert build_engine.cached_wheel("cpu").name.endswith(".whl")


def test_the_installed_engine_reports_its_build_record():
    from engine.runtime import native

    info = native.build_info()
    assert info["llama_cpp_python"] == "0.3.36"
    assert (Path(sys.prefix) / "mtp-studio-engine.json").exists()  # written by packaging/bootstrap.sh
    assert info["backend"] == "cpu" and info["cache_key"].startswith("llama-cpp-python-0.3.36-cpu-")


def test_a_patch_series_applies_or_the_build_stops_with_a_clear_message(build_engine, tmp_path):
    vendor = tmp_path / "tree" / "vendor" / "llama.cpp"
    vendor.mkdir(parents=True)
    (vendor / "llama-arch.cpp").write_text("one\ntwo\nthree\n")
    good = "--- a/llama-arch.cpp\n+++ b/llama-arch.cpp\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
    (build_engine.PATCH_DIR / "0001-good.patch").write_text(good)
    build_engine.apply_patch_series(tmp_path / "tree")
    assert (vendor / "llama-arch.cpp").read_text() == "one\nTWO\nthree\n"

    bad = "--- a/llama-arch.cpp\n+++ b/llama-arch.cpp\n@@ -1,3 +1,3 @@\n alpha\n-beta\n+BETA\n gamma\n"
    (build_engine.PATCH_DIR / "0002-bad.patch").write_text(bad)
    (vendor / "llama-arch.cpp").write_text("one\ntwo\nthree\n")
    with pytest.raises(SystemExit, match="0002-bad.patch does not apply"):
        build_engine.apply_patch_series(tmp_path / "tree")

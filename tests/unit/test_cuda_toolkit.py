"""The CUDA engine-libs build's toolkit: which one is used, PyPI's install, and what CMake is told.

Nothing here compiles or downloads: the toolkits are fake trees and pip is
replaced by a function that lays out what the CUDA 13 wheels install
(``nvidia/cu13/{bin,include,lib}`` with versioned libraries only).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

PACKAGING = Path(__file__).resolve().parents[2] / "packaging"


def _load(name: str):
    sys.path.insert(0, str(PACKAGING))
    try:
        spec = importlib.util.spec_from_file_location(name, PACKAGING / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(PACKAGING))


libs = _load("build_engine_libs")
cuda = libs.cuda_toolkit


def _toolkit(root: Path, *, cublas: bool = True, stub: bool = False, version: str = "13.0.88") -> Path:
    """A fake toolkit whose nvcc answers --version like the real one."""
    (root / "bin").mkdir(parents=True)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V{version}'\n")
    nvcc.chmod(0o755)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("")
    (root / "lib64").mkdir()
    (root / "lib64" / "libcudart.so").write_text("")
    if cublas:
        (root / "include" / "cublas_v2.h").write_text("")
        (root / "lib64" / "libcublas.so").write_text("")
        (root / "lib64" / "libcublasLt.so").write_text("")
    if stub:
        (root / "lib64" / "stubs").mkdir()
        (root / "lib64" / "stubs" / "libcuda.so").write_text("")
    return root


def test_a_toolkit_without_cublas_is_passed_over_and_says_what_it_lacks(tmp_path):
    # like this project's image: /usr/local/cuda has nvcc and the runtime, no cuBLAS
    partial = _toolkit(tmp_path / "partial", cublas=False)
    whole = _toolkit(tmp_path / "whole", stub=True)
    assert cuda.missing_parts(partial) == ["cublas_v2.h", "libcublas.so", "libcublasLt.so"]
    assert cuda.missing_parts(whole) == []
    said = []
    found = cuda.system_toolkit({"CUDAToolkit_ROOT": str(partial), "CUDA_PATH": str(whole), "PATH": ""}, said.append)
    assert found is not None and found.root == whole and found.source == "system"
    assert found.version == "13.0.88" and found.has_driver_stub
    assert said and str(partial) in said[0] and "libcublas.so" in said[0]


def test_the_candidates_come_explicit_first_and_nvcc_on_path_by_its_real_folder(tmp_path):
    tk = _toolkit(tmp_path / "cuda-13.0")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(tk / "bin" / "nvcc")
    env = {"CUDA_HOME": str(tmp_path / "home"), "PATH": str(tmp_path / "bin")}
    got = cuda.system_candidates(env)
    assert got[0] == tmp_path / "home" and got[1] == tk.resolve() and got[-1] == Path("/usr/local/cuda")


def test_unversioned_links_are_added_relative_and_only_where_missing(tmp_path):
    lib = tmp_path / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnvvm.so.4",
                 "libnvrtc-builtins.so.13.5", "libcudart_static.a", "libcudadevrt.a"):
        (lib / name).write_bytes(name.encode())
    (lib / "libcublas.so").write_bytes(b"already here")

    made = cuda.link_unversioned(lib)
    assert sorted(p.name for p in made) == ["libcublasLt.so", "libcudart.so", "libnvrtc-builtins.so", "libnvvm.so"]
    assert os.readlink(lib / "libcudart.so") == "libcudart.so.13"  # relative: the folder may move
    assert (lib / "libcublas.so").read_bytes() == b"already here"
    assert not (lib / "libcudart_static.so").exists()
    assert cuda.link_unversioned(lib) == []  # idempotent

    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "cu13"), moved)
    assert (moved / "lib" / "libcudart.so").read_bytes() == b"libcudart.so.13"


def _fake_pip(calls: list[list[str]], *, cublas: bool = True):
    """Stands in for `pip install --target DIR <the wheels>`: writes the wheels' layout into DIR."""

    def run(cmd, check):
        calls.append(cmd)
        root = Path(cmd[cmd.index("--target") + 1]) / "nvidia" / "cu13"
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "nvcc").write_text("")
        (root / "include").mkdir()
        (root / "include" / "cuda_runtime.h").write_text("")
        (root / "lib").mkdir()
        names = ["libcudart.so.13"] + (["libcublas.so.13", "libcublasLt.so.13"] if cublas else [])
        for name in names:
            (root / "lib" / name).write_text("")
        if cublas:
            (root / "include" / "cublas_v2.h").write_text("")

    return run


def test_pypis_toolkit_is_installed_once_into_a_folder_keyed_by_the_pinned_set(tmp_path):
    calls: list[list[str]] = []
    tk = cuda.install_pypi(tmp_path, python="/py", run=_fake_pip(calls), log=lambda m: None)
    assert len(calls) == 1
    cmd = calls[0]
    assert cmd[:4] == ["/py", "-m", "pip", "install"]
    wanted = {"nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-cuda-crt", "nvidia-nvvm",
              "nvidia-cublas"}
    pins = dict(a.split("==") for a in cmd if "==" in a)
    assert set(pins) == wanted and all(v.startswith("13.") for v in pins.values())
    assert Path(cmd[cmd.index("--target") + 1]).name.endswith(".partial")

    assert tk.root == tmp_path / cuda.pypi_key() / "nvidia" / "cu13" and tk.source == "pypi"
    assert tk.version == pins["nvidia-cuda-nvcc"] and tk.version in cuda.pypi_key()
    assert (tk.root / "lib" / "libcublasLt.so").resolve().name == "libcublasLt.so.13"
    assert cuda.missing_parts(tk.root) == []
    assert not list(tmp_path.glob("*.partial"))

    assert cuda.install_pypi(tmp_path, python="/py", run=_fake_pip(calls), log=lambda m: None) == tk
    assert len(calls) == 1  # cached


def test_an_incomplete_pypi_install_is_never_taken_for_a_toolkit(tmp_path):
    with pytest.raises(RuntimeError, match="lack cublas_v2.h, libcublas.so, libcublasLt.so"):
        cuda.install_pypi(tmp_path, run=_fake_pip([], cublas=False), log=lambda m: None)
    assert not (tmp_path / cuda.pypi_key()).exists()


def test_cmake_is_pinned_to_the_toolkit_and_the_architecture(tmp_path):
    tk = cuda.planned_pypi(tmp_path)
    args = libs.cmake_args("cuda", libs.CudaBuild(tk, "89"))
    assert "-DGGML_CUDA=ON" in args and "-DGGML_BACKEND_DL=ON" in args
    assert f"-DCUDAToolkit_ROOT={tk.root}" in args
    assert f"-DCMAKE_CUDA_COMPILER={tk.root}/bin/nvcc" in args  # never the nvcc found on PATH
    assert "-DCMAKE_CUDA_ARCHITECTURES=89" in args
    assert "-DGGML_CUDA_NO_VMM=ON" in args  # the wheels have no libcuda.so stub to link the VMM pool with
    system = cuda.Toolkit(tmp_path, tmp_path / "bin" / "nvcc", "13.0.88", "system", True)
    assert "-DGGML_CUDA_NO_VMM=ON" not in cuda.cmake_args(system, "90")
    for bad in ("", "sm_90", "90;", "ninety"):
        with pytest.raises(ValueError):
            cuda.check_arch(bad)
    assert cuda.check_arch("86;89;90a-real") == "86;89;90a-real"


def test_the_cache_key_has_the_architecture_and_toolkit_version_but_not_its_path(tmp_path):
    a = cuda.planned_pypi(tmp_path / "a")
    b = cuda.planned_pypi(tmp_path / "b")
    key = libs.cache_key("cuda", libs.CudaBuild(a, "90"))
    assert key == libs.cache_key("cuda", libs.CudaBuild(b, "90"))  # same toolkit elsewhere: same build
    assert "-cuda-sm90-" in key
    assert key != libs.cache_key("cuda", libs.CudaBuild(a, "89"))
    older = cuda.Toolkit(a.root, a.nvcc, "13.0.88", "pypi", False)
    assert key != libs.cache_key("cuda", libs.CudaBuild(older, "90"))
    assert libs.work_dir("cuda", libs.CudaBuild(a, "89")) != libs.work_dir("cuda", libs.CudaBuild(a, "90"))
    assert libs.cache_key(None) != key and libs.cache_key("vulkan") != key


def test_print_dir_names_the_cuda_folder_without_installing_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MTP_STUDIO_WHEEL_CACHE", str(tmp_path / "wheels"))

    def refuse(*a, **k):
        raise AssertionError("--print-dir must not install a toolkit")

    monkeypatch.setattr(cuda, "install_pypi", refuse)
    assert libs.main(["--gpu", "cuda", "--cuda-from-pypi", "--cuda-arch", "89", "--print-dir"]) == 0
    out = capsys.readouterr().out.strip()
    assert "\n" not in out  # build_linux.sh reads the folder from stdout
    assert out.startswith(str(tmp_path / "engine-libs" / "llama-cpp-dl-0.3.36-cuda-sm89-")) and out.endswith("/lib")

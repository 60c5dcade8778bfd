#!/usr/bin/env python3
"""Build llama.cpp's shared libraries with run-time backend selection, for the installers.

The developer engine (``build_engine.py``) compiles one CPU code path for the
machine it runs on. An installer cannot: it must run on any x86-64 CPU. So the
installers carry llama.cpp built with ``GGML_BACKEND_DL=ON`` and
``GGML_CPU_ALL_VARIANTS=ON``: ``libggml`` loads every ``libggml-cpu-<variant>``
found next to it, asks each for a score (0 when the CPU lacks an instruction
set the variant was compiled with) and keeps the best. GPU backends
(``libggml-cuda``/``-vulkan``/``-hip``/``-metal``) are separate libraries found
the same way, so an installer can carry them without requiring them.

Why a direct CMake build and not the wheel: llama-cpp-python's CMakeLists
installs a fixed list of targets (``ggml-cpu`` but no ``ggml-cpu-<variant>``),
so a wheel built with these flags lacks the variant libraries. The Python side
of llama_cpp is the same for every build; the freezer takes it from the
environment and these libraries replace ``llama_cpp/lib``.

AMX: ggml's ``sapphirerapids`` variant is the only one compiled with AMX and
it is the one ggml would pick on any CPU that reports AMX -- including the
machines this project is developed on, where AMX kernels die with SIGILL. That
variant is never built (the explicit target list below leaves it out), so it
cannot be shipped or picked; such CPUs get ``zen4`` (AVX-512 VNNI/BF16).

CUDA: the toolkit is the machine's own when it is whole, else (or with
``--cuda-from-pypi``) NVIDIA's CUDA 13 wheels from PyPI, installed once into
``~/.cache/mtp-studio/build-tools/`` (``cuda_toolkit.py``). ggml-cuda is compiled
for one architecture list, ``--cuda-arch`` (default 90: H100/H200; 89 for RTX
40xx), which is part of the cache key and of the kept build folder's name.

The patch series in ``packaging/patches`` is applied exactly as for the wheel.
Results are cached by (version, CMake args, variants, patches, platform, and
for CUDA the toolkit version and architectures); the CMake build folder is
kept so an interrupted build resumes.

Usage:
    python packaging/build_engine_libs.py [--gpu cuda|vulkan|hip|metal] [--sdist PATH] [--print-dir]
                                          [--cuda-arch 90] [--cuda-from-pypi]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_engine  # noqa: E402  (sibling script, standard library only)
import cuda_toolkit  # noqa: E402  (sibling script, standard library only)

RECORD_NAME = build_engine.BUILD_RECORD_NAME

# CPU variants shipped on x86-64, oldest first. Three upstream variants
# (cannonlake, cascadelake, cooperlake) are left out to keep the compile and
# the download small: a CPU that would have matched one scores the next lower
# variant instead (skylakex or icelake). sapphirerapids (AMX) is left out on
# purpose -- see the module docstring. MSVC cannot build ivybridge,
# piledriver and zen4 (upstream's CMakeLists skips them there too).
X86_VARIANTS = ("x64", "sse42", "sandybridge", "ivybridge", "piledriver", "haswell", "skylakex", "icelake",
                "alderlake", "zen4")
EXCLUDED_VARIANTS = ("cannonlake", "cascadelake", "cooperlake", "sapphirerapids")
NOT_ON_MSVC = ("ivybridge", "piledriver", "zen4")
_VARIANT_LINE = re.compile(r"^(\s*)ggml_add_cpu_backend_variant\((\w+)\b")


def shipped_variants() -> tuple[str, ...]:
    if not is_x86():
        return ()
    return tuple(v for v in X86_VARIANTS if not (sys.platform == "win32" and v in NOT_ON_MSVC))


def restrict_cpu_variants(tree: Path) -> None:
    """Take the excluded variants out of the build's copy of ggml/src/CMakeLists.txt.

    Upstream has no option for the variant list, and leaving a variant out of
    the targets is not enough: libggml depends on every variant, so building
    it builds them all -- the AMX one included. The edit comments out their
    lines, is idempotent, and touches only this build's unpacked copy (not a
    patch of the series: the developer engine has no variants at all).
    """
    cmake = tree / "vendor" / "llama.cpp" / "ggml" / "src" / "CMakeLists.txt"
    if not cmake.exists():
        return
    lines = cmake.read_text().splitlines(keepends=True)
    out = []
    for line in lines:
        m = _VARIANT_LINE.match(line)
        if m and m.group(2) in EXCLUDED_VARIANTS:
            line = f"{m.group(1)}# excluded by packaging/build_engine_libs.py: {line.lstrip()}"
        out.append(line)
    if out != lines:
        cmake.write_text("".join(out))


GPU_TARGETS = {"cuda": ("-DGGML_CUDA=ON", "ggml-cuda"), "vulkan": ("-DGGML_VULKAN=ON", "ggml-vulkan"),
               "hip": ("-DGGML_HIP=ON", "ggml-hip"), "metal": ("-DGGML_METAL=ON", "ggml-metal")}


class CudaBuild(NamedTuple):
    """The toolkit ggml-cuda is compiled with and the architectures it is compiled for."""

    toolkit: cuda_toolkit.Toolkit
    arch: str


def tools_root() -> Path:
    """Build tools fetched for the engine builds (PyPI's CUDA toolkit), beside the built libraries."""
    return build_engine.cache_root().parent / "build-tools"


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cmake_args(gpu: str | None, cuda: CudaBuild | None = None) -> list[str]:
    rpath = "@loader_path" if sys.platform == "darwin" else "$ORIGIN"
    args = [
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON", "-DGGML_NATIVE=OFF",
        "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_OPENSSL=OFF", f"-DCMAKE_INSTALL_RPATH={rpath}", "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    ]
    # whatever every developer build carries too (the RPC backend), as a loadable library here
    args += getattr(build_engine, "_COMMON_ARGS", [])
    if is_x86():
        args.append("-DGGML_CPU_ALL_VARIANTS=ON")
    if gpu:
        args.append(GPU_TARGETS[gpu][0])
    if sys.platform == "darwin" and gpu == "metal":
        args.append("-DGGML_METAL_EMBED_LIBRARY=ON")
    if gpu == "cuda" and cuda is not None:
        args += cuda_toolkit.cmake_args(cuda.toolkit, cuda.arch)
    return args


def targets(gpu: str | None) -> list[str]:
    names = ["llama", "ggml", "ggml-base"]
    if "-DGGML_RPC=ON" in cmake_args(gpu):
        names.append("ggml-rpc")
    names += [f"ggml-cpu-{v}" for v in shipped_variants()] if is_x86() else ["ggml-cpu"]
    if gpu:
        names.append(GPU_TARGETS[gpu][1])
    return names


def _flavour(gpu: str | None, cuda: CudaBuild | None) -> str:
    """cpu, vulkan, ... or cuda-sm90: what a folder name says about the build."""
    if gpu == "cuda" and cuda is not None:
        return "cuda-sm" + cuda.arch.replace(";", "-")
    return gpu or "cpu"


def cache_key(gpu: str | None, cuda: CudaBuild | None = None) -> str:
    fields = {"version": build_engine.LLAMA_CPP_PYTHON_VERSION, "cmake_args": cmake_args(gpu),
              "targets": targets(gpu), "patches": build_engine.patch_hash(gpu or "cpu"),
              "machine": platform.machine(), "os": sys.platform}
    if gpu == "cuda" and cuda is not None:  # the toolkit's version and the architectures, not its path
        fields.update(cuda_toolkit.key_fields(cuda.toolkit, cuda.arch))
    short = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
    return f"llama-cpp-dl-{build_engine.LLAMA_CPP_PYTHON_VERSION}-{_flavour(gpu, cuda)}-{short}"


def cache_dir(gpu: str | None, cuda: CudaBuild | None = None) -> Path:
    """Where the finished libraries of this exact build are kept."""
    return build_engine.cache_root().parent / "engine-libs" / cache_key(gpu, cuda)


def work_dir(gpu: str | None, cuda: CudaBuild | None = None) -> Path:
    """The patched source and the CMake build folder, kept between builds.

    Keyed by version and GPU only: when patches are added to the series, only
    the new ones are applied to the kept tree and ninja recompiles only the
    files they touch. A series that is not an extension of what was applied
    (a patch edited or removed) unpacks the source afresh.
    """
    if os.environ.get("MTP_ENGINE_LIBS_WORK"):  # e.g. a CI cache folder
        return Path(os.environ["MTP_ENGINE_LIBS_WORK"])
    name = f"work-{build_engine.LLAMA_CPP_PYTHON_VERSION}-{_flavour(gpu, cuda)}"
    return build_engine.cache_root().parent / "engine-libs" / name


def _series(gpu: str | None) -> list[list[str]]:
    return [[p.name, hashlib.sha256(p.read_bytes()).hexdigest()] for p in build_engine.patch_series(gpu or "cpu")]


def _apply(vendor: Path, patch: Path) -> None:
    proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", str(patch)], cwd=vendor,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise build_engine.PatchError(f"error: {patch.name} does not apply to the llama.cpp vendored in "
                                      f"llama-cpp-python {build_engine.LLAMA_CPP_PYTHON_VERSION}; nothing was built."
                                      f"\n{(proc.stdout + proc.stderr).strip()[-800:]}")
    print(f"applied {patch.name}", flush=True)


def _source_tree(folder: Path, sdist: Path | None, gpu: str | None = None) -> Path:
    """The unpacked sdist with the whole patch series applied (see :func:`work_dir`)."""
    tree = folder / "src"
    ready = folder / "src.applied.json"
    want = _series(gpu)
    try:
        have = json.loads(ready.read_text())
    except (OSError, ValueError):
        have = None
    if have is not None and tree.exists() and want[: len(have)] == have:
        by_name = {p.name: p for p in build_engine.patch_series(gpu or "cpu")}
        for name, _digest in want[len(have):]:
            _apply(tree / "vendor" / "llama.cpp", by_name[name])
            have.append([name, _digest])
            ready.write_text(json.dumps(have))
        restrict_cpu_variants(tree)
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    ready.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="mtp-engine-libs-") as tmp:
        archive = sdist or build_engine._fetch_sdist(Path(tmp))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = next(p for p in Path(tmp).iterdir() if p.is_dir() and p.name.startswith("llama_cpp_python"))
        for patch in build_engine.patch_series(gpu or "cpu"):
            _apply(unpacked / "vendor" / "llama.cpp", patch)
        shutil.move(str(unpacked), tree)
    ready.write_text(json.dumps(want))
    restrict_cpu_variants(tree)
    return tree


def _shared_libs(build: Path, gpu: str | None) -> list[Path]:
    """The built libraries of exactly our targets (the folder may hold others from earlier configurations)."""
    wanted = set(targets(gpu))
    found = []
    for path in sorted((build / "bin").iterdir()):
        stem = path.name.removeprefix("lib").split(".")[0]
        if stem in wanted and path.suffix in (".so", ".dylib", ".dll") or ".so." in path.name and stem in wanted:
            found.append(path)
    return found


def build(gpu: str | None, sdist: Path | None, jobs: int, cuda: CudaBuild | None = None) -> Path:
    folder = cache_dir(gpu, cuda)  # keyed by the patch series as it is now, which is what gets applied
    series, phash = [p.name for p in build_engine.patch_series(gpu or "cpu")], build_engine.patch_hash(gpu or "cpu")
    lib = folder / "lib"
    if (lib / RECORD_NAME).exists():
        print(f"engine libs: using cached {lib}")
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    work = work_dir(gpu, cuda)
    work.mkdir(parents=True, exist_ok=True)
    tree = _source_tree(work, sdist, gpu)
    vendor = tree / "vendor" / "llama.cpp"
    bdir = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    build_engine._run(["cmake", "-S", str(vendor), "-B", str(bdir), *generator, *cmake_args(gpu, cuda)])
    build_engine._run(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs),
                       "--target", *targets(gpu)])
    staging = folder / "lib.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    for path in _shared_libs(bdir, gpu):
        shutil.copy2(path, staging / path.name, follow_symlinks=False)
    names = sorted(p.name for p in staging.iterdir())
    record = {
        "llama_cpp_python": build_engine.LLAMA_CPP_PYTHON_VERSION,
        "backend": gpu or "cpu",
        "backend_loading": "dynamic",
        "cmake_args": cmake_args(gpu, cuda),
        "cpu_variants": list(shipped_variants()) if is_x86() else ["native-arch default"],
        "excluded_cpu_variants": list(EXCLUDED_VARIANTS) if is_x86() else [],
        "patch_hash": phash,
        "patches": series,
        "cache_key": cache_key(gpu, cuda),
        "libraries": names,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if gpu == "cuda" and cuda is not None:
        record["cuda"] = {"toolkit_version": cuda.toolkit.version, "toolkit_source": cuda.toolkit.source,
                          "architectures": cuda.arch, "vmm_pool": cuda.toolkit.has_driver_stub}
    (staging / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    staging.replace(lib)  # only a complete set carries the lib name
    print(f"engine libs: built {lib}")
    return lib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", choices=sorted(GPU_TARGETS), default=None, help="also build this GPU backend")
    parser.add_argument("--sdist", type=Path, default=None, help="llama_cpp_python sdist (default: pip download)")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2")))
    parser.add_argument("--print-dir", action="store_true", help="print where the libraries are (or will be)")
    parser.add_argument("--cuda-arch", default=cuda_toolkit.DEFAULT_ARCH, type=_arch,
                        help="CMAKE_CUDA_ARCHITECTURES for --gpu cuda (default %(default)s: H100/H200; "
                             "89: RTX 40xx/L4/L40; a ;-list builds several)")
    parser.add_argument("--cuda-from-pypi", action="store_true",
                        help="use PyPI's CUDA 13 wheels even when this machine has a whole CUDA toolkit")
    args = parser.parse_args(argv)
    cuda = None
    if args.gpu == "cuda":
        log = (lambda m: print(m, file=sys.stderr)) if args.print_dir else print  # stdout is the folder
        toolkit = cuda_toolkit.resolve(tools_root(), args.cuda_from_pypi, install=not args.print_dir, log=log)
        cuda = CudaBuild(toolkit, args.cuda_arch)
        log(f"cuda toolkit: {toolkit.describe()}, architectures {args.cuda_arch}")
    if args.print_dir:
        print(cache_dir(args.gpu, cuda) / "lib")
        return 0
    build(args.gpu, args.sdist, args.jobs, cuda)
    return 0


def _arch(value: str) -> str:
    try:
        return cuda_toolkit.check_arch(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


if __name__ == "__main__":
    sys.exit(main())

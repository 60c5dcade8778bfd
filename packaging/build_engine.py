#!/usr/bin/env python3
"""Build (or reuse) the llama-cpp-python wheel for one backend and install it.

The engine is llama-cpp-python built from its pinned sdist, with this
project's patch series applied to the vendored llama.cpp. Building takes
7-12 minutes on two cores, so finished wheels are cached outside the
repository, keyed by (version, backend, CMake arguments, patch-series hash).
A cold machine builds; a warm one installs in seconds.

Standard library only: this runs before the project's own dependencies are
installed.

Usage:
    python packaging/build_engine.py [--backend cpu|cuda|metal|vulkan|rocm]
                                     [--no-install] [--print-key]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
BACKENDS = ("cpu", "cuda", "metal", "vulkan", "rocm")
PATCH_DIR = Path(__file__).resolve().parent / "patches"
BUILD_RECORD_NAME = "mtp-studio-engine.json"

# x86 instruction sets we are willing to compile in, as (cpuinfo flag, CMake
# option), in the order llama.cpp documents them. AMX is deliberately absent:
# on the machines this project is developed on the CPU reports AMX, and
# ggml's AMX kernels die with SIGILL on the first quantized matmul.
_X86_ISA = (
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("bmi2", "GGML_BMI2"),
    ("avx512f", "GGML_AVX512"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
)

_BACKEND_ARGS = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON"],
    "metal": ["-DGGML_METAL=ON"],
    "vulkan": ["-DGGML_VULKAN=ON"],
    "rocm": ["-DGGML_HIP=ON"],
}


def cache_root() -> Path:
    """Where built wheels are kept (outside git, shared by every checkout)."""
    env = os.environ.get("MTP_STUDIO_WHEEL_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mtp-studio" / "wheels"


def cpu_isa_args() -> list[str]:
    """CMake options for the CPU code paths, chosen from what this CPU reports.

    Never ``-DGGML_NATIVE=ON``: a native build also enables AMX where the CPU
    advertises it, which crashes here (see the module docstring).
    """
    args = ["-DGGML_NATIVE=OFF"]
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return args
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    if not flags:  # not Linux: a conservative baseline every x86-64 v3 CPU has
        flags = {"avx", "avx2", "fma", "f16c", "bmi2"}
    args += [f"-D{opt}=ON" for flag, opt in _X86_ISA if flag in flags]
    return args


# Every build carries ggml's RPC backend, so a model can be split across
# machines (docs/multi-machine.md); it costs one small library and nothing
# at run time unless remote servers are named.
_COMMON_ARGS = ["-DGGML_RPC=ON"]


def cmake_args(backend: str) -> list[str]:
    return _BACKEND_ARGS[backend] + _COMMON_ARGS + cpu_isa_args()


def patch_series(backend: str = "cpu") -> list[Path]:
    """The patches a build for ``backend`` applies, in order.

    Every build applies ``patches/*.patch``; a build for a GPU backend then
    applies ``patches/<backend>/*.patch`` too. A patch that touches only one
    backend's source lives in that backend's folder, so it is keyed into
    that backend's wheel alone and a fix for Debian's Vulkan headers does not
    rebuild every CPU engine.
    """
    return sorted(PATCH_DIR.glob("*.patch")) + sorted((PATCH_DIR / backend).glob("*.patch"))


def patch_hash(backend: str = "cpu") -> str:
    digest = hashlib.sha256()
    for patch in patch_series(backend):
        digest.update(patch.name.encode())
        digest.update(patch.read_bytes())
    return digest.hexdigest()[:12]


def cache_key(backend: str) -> str:
    spec = json.dumps(
        {
            "version": LLAMA_CPP_PYTHON_VERSION,
            "backend": backend,
            "cmake_args": cmake_args(backend),
            "patches": patch_hash(backend),
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "machine": platform.machine(),
        },
        sort_keys=True,
    )
    short = hashlib.sha256(spec.encode()).hexdigest()[:16]
    return f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-{backend}-{short}"


def _run(cmd: list[str], **kwargs: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def cached_sdist() -> Path:
    """Where the pinned sdist is kept once downloaded: beside the wheels, so the
    patch test (tests/unit/test_patches.py) and later builds need no network."""
    return cache_root() / "sdist" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"


def _fetch_sdist(workdir: Path) -> Path:
    kept = cached_sdist()
    if kept.is_file():
        return kept
    _run(
        [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(workdir),
        ]
    )
    got = next(workdir.glob("llama_cpp_python-*.tar.gz"))
    kept.parent.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(kept.name + ".partial")
    shutil.copy2(got, partial)
    partial.replace(kept)  # only a complete download carries the final name
    return kept


class PatchError(SystemExit):
    """A patch of the series does not apply: the build stops before compiling."""


def apply_patch_series(tree: Path, backend: str = "cpu") -> None:
    """Apply every patch to ``tree``/vendor/llama.cpp, or stop with a clear message.

    Without fuzz: a hunk whose context only matches loosely was made against
    other code and may land in the wrong place, which compiles and then
    misbehaves (tests/unit/test_patches.py holds the series to the same rule).
    """
    vendor = tree / "vendor" / "llama.cpp"
    for patch in patch_series(backend):
        proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", str(patch)], cwd=vendor,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise PatchError(
                f"error: {patch.name} does not apply to the llama.cpp vendored in llama-cpp-python "
                f"{LLAMA_CPP_PYTHON_VERSION}; the build stopped before compiling and the installed engine "
                f"is unchanged.\n{(proc.stdout + proc.stderr).strip()[-800:]}"
            )
        print(f"applied {patch.name}", flush=True)


def _apply_patches(sdist: Path, workdir: Path, backend: str) -> Path:
    """Unpack the sdist and apply the backend's patch series; return the source tree."""
    with tarfile.open(sdist) as tar:
        tar.extractall(workdir, filter="data")
    tree = next(p for p in workdir.iterdir() if p.is_dir() and p.name.startswith("llama_cpp_python"))
    apply_patch_series(tree, backend)
    return tree


def build_wheel(backend: str, dest: Path) -> Path:
    """Build the wheel into ``dest`` and return its path. Streams the compiler log."""
    env = dict(os.environ)
    env["CMAKE_ARGS"] = " ".join(cmake_args(backend))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    with tempfile.TemporaryDirectory(prefix="mtp-engine-build-") as tmp:
        work = Path(tmp)
        sdist = _fetch_sdist(work)
        source: Path = _apply_patches(sdist, work, backend) if patch_series(backend) else sdist
        out = work / "wheel"
        _run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", str(source), "-w", str(out)],
            env=env,
        )
        wheel = next(out.glob("*.whl"))
        partial = dest / (wheel.name + ".partial")
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel, partial)
        final = dest / wheel.name
        partial.replace(final)  # only a complete wheel ever carries the .whl name
        return final


def cached_wheel(backend: str) -> Path | None:
    folder = cache_root() / cache_key(backend)
    wheels = sorted(folder.glob("*.whl"))
    return wheels[0] if wheels else None


def write_build_record(backend: str, wheel: Path) -> Path:
    """Record what was installed; the worker reports it in its handshake."""
    record = {
        "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
        "backend": backend,
        "cmake_args": cmake_args(backend),
        "patch_hash": patch_hash(backend),
        "patches": [p.relative_to(PATCH_DIR).as_posix() for p in patch_series(backend)],
        "cache_key": cache_key(backend),
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = Path(sys.prefix) / BUILD_RECORD_NAME
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def _installed_matches(backend: str) -> bool:
    path = Path(sys.prefix) / BUILD_RECORD_NAME
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if record.get("cache_key") != cache_key(backend):
        return False
    probe = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('llama_cpp_python'))"],
        capture_output=True, text=True,
    )
    return probe.stdout.strip() == LLAMA_CPP_PYTHON_VERSION


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, default="cpu")
    parser.add_argument("--no-install", action="store_true", help="build or find the wheel only")
    parser.add_argument("--print-key", action="store_true", help="print the cache key and exit")
    args = parser.parse_args(argv)

    if args.print_key:
        print(cache_key(args.backend))
        return 0
    if not args.no_install and _installed_matches(args.backend):
        print(f"engine: {cache_key(args.backend)} already installed in {sys.prefix}")
        return 0

    wheel = cached_wheel(args.backend)
    if wheel is None:
        print(f"engine: no cached wheel for {cache_key(args.backend)}; building "
              f"(this takes several minutes)", flush=True)
        wheel = build_wheel(args.backend, cache_root() / cache_key(args.backend))
    else:
        print(f"engine: using cached wheel {wheel}")
    if args.no_install:
        print(wheel)
        return 0
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(wheel)])
    print(f"engine: build record {write_build_record(args.backend, wheel)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

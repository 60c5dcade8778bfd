#!/usr/bin/env python3
"""Build llama.cpp's own speculative driver (``llama-speculative-simple``)
from the same pinned llama-cpp-python sdist the engine is built from, so the
benchmark can compare our Python MTP loop with the C++ one on equal terms.

The binary is cached next to the engine wheels, keyed like them; a cold
machine builds it (a few minutes on two cores). Prints the binary's path.

Usage:
    python packaging/build_reference_driver.py [--backend cpu]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_engine  # noqa: E402

TARGET = "llama-speculative-simple"


def driver_path(backend: str) -> Path:
    return build_engine.cache_root() / build_engine.cache_key(backend) / "bin" / TARGET


def build(backend: str) -> Path:
    out = driver_path(backend)
    if out.exists():
        return out
    with tempfile.TemporaryDirectory(prefix="mtp-refdriver-") as tmp:
        work = Path(tmp)
        sdist = build_engine._fetch_sdist(work)
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        tree = next(p for p in work.iterdir() if p.is_dir() and p.name.startswith("llama_cpp_python"))
        src = tree / "vendor" / "llama.cpp"
        build_engine.apply_patch_series(tree)
        build_dir = work / "build"
        cmake = ["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
                 *build_engine.cmake_args(backend)]
        print("+", " ".join(cmake), flush=True)
        subprocess.run(cmake, check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", TARGET, "-j", jobs], check=True)
        built = next(build_dir.rglob(TARGET))
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        shutil.copy2(built, partial)
        partial.replace(out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=build_engine.BACKENDS, default="cpu")
    args = parser.parse_args()
    print(build(args.backend))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Build llama.cpp's own speculative driver (``llama-speculative-simple``)
from the same pinned llama-cpp-python sdist the engine is built from, so the
benchmark can compare our Python MTP loop with the C++ one on equal terms.
The same CMake tree also builds ggml's RPC server (``ggml-rpc-server``),
which ``mtp-studio rpc-server`` runs on a machine that lends its devices:
it must speak the RPC protocol of the engine's own ggml, so it comes from
the same source and patches.

The binaries are cached next to the engine wheels, keyed like them; a cold
machine builds them (about 7 minutes on two cores). Prints the driver's path
(``--print rpc-server``: the RPC server's).

``bootstrap.sh --test`` runs this with ``--record``: the binaries' paths and
key are written into the virtual environment, so the tests know the set-up
was done and fail (instead of skipping) when the driver is missing or was
built for another engine.

``--server`` builds llama.cpp's ``llama-server`` instead (alone, into the same
cache folder), for the benchmarks that compare our server with it; nothing
else asks for it, so CI never builds it.

Usage:
    python packaging/build_reference_driver.py [--backend cpu] [--record] [--print driver|rpc-server]
    python packaging/build_reference_driver.py --server [--backend cpu]
"""

from __future__ import annotations

import argparse
import json
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
RPC_SERVER_TARGET = "ggml-rpc-server"
TARGETS = (TARGET, RPC_SERVER_TARGET)  # built together: one configure, one cache folder
SERVER_TARGET = "llama-server"  # only with --server, in a configure of its own
RECORD_NAME = "mtp-studio-reference-driver.json"  # in the virtual environment, beside the engine's record


def tool_path(backend: str, target: str) -> Path:
    return build_engine.cache_root() / build_engine.cache_key(backend) / "bin" / target


def driver_path(backend: str) -> Path:
    return tool_path(backend, TARGET)


def rpc_server_path(backend: str) -> Path:
    return tool_path(backend, RPC_SERVER_TARGET)


def server_path(backend: str) -> Path:
    return tool_path(backend, SERVER_TARGET)


def cmake_binary() -> str:
    """``cmake`` from PATH, else the binary of PyPI's ``cmake`` wheel (kept in the
    cache). The engine's build brings its own cmake through pip; a bare
    machine has none for this one."""
    found = shutil.which("cmake")
    if found:
        return found
    tools = build_engine.cache_root() / "build-tools"
    binary = tools / "cmake" / "data" / "bin" / "cmake"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--target", str(tools), "cmake"], check=True)
    return str(binary)


def _build_targets(backend: str, targets: tuple[str, ...], options: list[str]) -> None:
    """Configure the patched sdist's llama.cpp once with ``options`` and build
    ``targets`` into the cache folder (a copy per binary, renamed into place)."""
    with tempfile.TemporaryDirectory(prefix="mtp-refdriver-") as tmp:
        work = Path(tmp)
        sdist = build_engine._fetch_sdist(work)
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        tree = next(p for p in work.iterdir() if p.is_dir() and p.name.startswith("llama_cpp_python"))
        src = tree / "vendor" / "llama.cpp"
        build_engine.apply_patch_series(tree, backend)
        build_dir = work / "build"
        cmake = [cmake_binary(), "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", *options, *build_engine.cmake_args(backend)]
        print("+", " ".join(cmake), flush=True)
        subprocess.run(cmake, check=True)
        jobs = str(os.cpu_count() or 2)
        subprocess.run([cmake[0], "--build", str(build_dir), "--target", *targets, "-j", jobs], check=True)
        for target in targets:
            built = next(p for p in build_dir.rglob(target) if p.is_file())
            dest = tool_path(backend, target)
            dest.parent.mkdir(parents=True, exist_ok=True)
            partial = dest.with_suffix(".partial")
            shutil.copy2(built, partial)
            partial.replace(dest)


def build(backend: str) -> Path:
    out = driver_path(backend)
    if all(tool_path(backend, target).exists() for target in TARGETS):
        return out
    _build_targets(backend, TARGETS, ["-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_EXAMPLES=ON"])
    return out


def build_server(backend: str) -> Path:
    """llama.cpp's own ``llama-server`` from the same source and patches, for
    ``mtp-studio bench-concurrency`` and ``bench-conversation --llama-server``.
    Only on request (``--server``): CI never needs it. No web UI (nothing is
    downloaded at build time), no curl, no OpenSSL."""
    out = server_path(backend)
    if out.exists():
        return out
    _build_targets(backend, (SERVER_TARGET,),
                   ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"])
    return out


def write_record(backend: str, binary: Path) -> Path:
    """Say, in this environment, which driver goes with which engine build."""
    path = Path(sys.prefix) / RECORD_NAME
    record = {"path": str(binary), "rpc_server": str(rpc_server_path(backend)), "backend": backend,
              "cache_key": build_engine.cache_key(backend)}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=build_engine.BACKENDS, default="cpu")
    parser.add_argument("--record", action="store_true", help=f"write {RECORD_NAME} into this environment")
    parser.add_argument("--print", dest="show", choices=("driver", "rpc-server"), default="driver",
                        help="which binary's path to print")
    parser.add_argument("--server", action="store_true",
                        help=f"build {SERVER_TARGET} (only that) and print its path")
    args = parser.parse_args()
    if args.server:
        if not server_path(args.backend).exists():
            print(f"reference server: building {SERVER_TARGET} for {build_engine.cache_key(args.backend)} "
                  "(10-20 minutes on two cores)", flush=True)
        print(build_server(args.backend))
        return 0
    cached = all(tool_path(args.backend, target).exists() for target in TARGETS)
    if not cached:
        print(f"reference driver: building {', '.join(TARGETS)} for {build_engine.cache_key(args.backend)} "
              "(several minutes)", flush=True)
    binary = build(args.backend)
    if args.record:
        write_record(args.backend, binary)
    print(rpc_server_path(args.backend) if args.show == "rpc-server" else binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

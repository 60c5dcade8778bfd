"""The CUDA toolkit a ggml-cuda build compiles with: the machine's own if it is whole, else PyPI's.

Why PyPI: a build machine (this project's, a CI runner, a contributor's PC)
rarely has NVIDIA's installer toolkit, but pip reaches NVIDIA's CUDA 13
wheels, which together hold everything ggml-cuda needs: ``nvcc`` and its
back ends (nvcc, crt, nvvm), the runtime and cuBLAS headers and libraries,
and CCCL (CUB/Thrust). The ``-cu12`` nvcc wheel has no ``nvcc`` binary, so
it is CUDA 13 or nothing. The wheels are installed with ``pip --target``
into a cache folder keyed by the pinned set, never into an environment.

Three things the wheels lack, each handled here:

- unversioned library names: they ship ``libcudart.so.13`` etc. only, and
  CMake's FindCUDAToolkit looks for ``libcudart.so`` -- symlinks are added;
- ``libcuda.so`` (the driver's link stub): ggml-cuda links the driver only
  for its virtual-memory pool, so such a toolkit builds with
  ``GGML_CUDA_NO_VMM=ON`` (the legacy pool; the driver is still loaded at
  run time through the runtime library);
- a place on ``PATH``: the compiler and the root are passed to CMake
  explicitly, which also keeps a partial toolkit on the machine (this
  project's image has ``/usr/local/cuda`` with ``nvcc`` and the runtime but
  no cuBLAS) from being found first.

Standard library only: ``build_engine_libs.py`` runs before any environment
exists. See docs/gpu.md and docs/installers.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The pinned CUDA 13 set (nvcc 13.5); nvidia-cuda-nvrtc comes in as a dependency.
PYPI_WHEELS = (
    ("nvidia-cuda-nvcc", "13.5.37"),
    ("nvidia-cuda-runtime", "13.5.37"),
    ("nvidia-cuda-cccl", "13.3.5.0.6"),
    ("nvidia-cuda-crt", "13.5.37"),
    ("nvidia-nvvm", "13.5.37"),
    ("nvidia-cublas", "13.10.0.20"),
)
PYPI_NVCC_VERSION = dict(PYPI_WHEELS)["nvidia-cuda-nvcc"]
# sm_90: Hopper (H100/H200), what this project's lent devices are; 89 is Ada (RTX 40xx, L4, L40).
DEFAULT_ARCH = "90"
# What ggml-cuda includes and links (CUDA::cudart, CUDA::cublas, CUDA::cublasLt).
NEEDED_HEADERS = ("cuda_runtime.h", "cublas_v2.h")
NEEDED_LIBS = ("libcudart.so", "libcublas.so", "libcublasLt.so")
_VERSIONED = re.compile(r"^(lib[\w+-]+\.so)(\.\d+)+$")
_ARCH = re.compile(r"^\d{2,3}[a-f]?(-real|-virtual)?$")


@dataclass(frozen=True)
class Toolkit:
    root: Path
    nvcc: Path
    version: str  # nvcc's, e.g. "13.5.37"
    source: str  # "system" or "pypi"
    has_driver_stub: bool  # lib{64,}/stubs/libcuda.so: ggml's VMM pool can be linked

    def describe(self) -> str:
        return f"CUDA {self.version} ({self.source}: {self.root})"


def check_arch(arch: str) -> str:
    """One CMAKE_CUDA_ARCHITECTURES entry or a ;-list of them ("89", "90", "86;89", "90a-real")."""
    parts = arch.split(";")
    if not arch or not all(_ARCH.match(p) for p in parts):
        raise ValueError(f"not a CUDA architecture list: {arch!r} (e.g. 89 for RTX 40xx, 90 for H100/H200)")
    return arch


def pypi_key() -> str:
    """Names the install folder: the nvcc version plus a hash of the whole pinned set."""
    short = hashlib.sha256(json.dumps(PYPI_WHEELS).encode()).hexdigest()[:8]
    return f"cuda-{PYPI_NVCC_VERSION}-{short}"


def pypi_dir(tools_root: Path) -> Path:
    return tools_root / pypi_key()


def pip_command(target: Path, python: str = sys.executable) -> list[str]:
    return [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-warn-script-location",
            "--target", str(target), *(f"{name}=={version}" for name, version in PYPI_WHEELS)]


def _lib_dirs(root: Path) -> list[Path]:
    dirs = [root / "lib64", root / "lib"]
    dirs += sorted((root / "targets").glob("*/lib")) if (root / "targets").is_dir() else []
    return [d for d in dirs if d.is_dir()]


def _include_dirs(root: Path) -> list[Path]:
    dirs = [root / "include"]
    dirs += sorted((root / "targets").glob("*/include")) if (root / "targets").is_dir() else []
    return [d for d in dirs if d.is_dir()]


def missing_parts(root: Path) -> list[str]:
    """What a ggml-cuda build needs that ``root`` lacks (empty: a whole toolkit)."""
    missing = [] if (root / "bin" / "nvcc").is_file() else ["bin/nvcc"]
    missing += [h for h in NEEDED_HEADERS if not any((d / h).is_file() for d in _include_dirs(root))]
    missing += [lib for lib in NEEDED_LIBS if not any((d / lib).exists() for d in _lib_dirs(root))]
    return missing


def has_driver_stub(root: Path) -> bool:
    return any((d / "stubs" / "libcuda.so").exists() or (d / "libcuda.so").exists() for d in _lib_dirs(root))


def link_unversioned(lib: Path) -> list[Path]:
    """Add ``libX.so -> libX.so.N`` for every versioned library that has no unversioned name.

    Relative links, so the folder may be moved (it is: installed as .partial,
    then renamed). Existing names are left alone; returns the links made.
    """
    made = []
    for path in sorted(lib.iterdir()):
        m = _VERSIONED.match(path.name)
        if not m:
            continue
        link = lib / m.group(1)
        if link.exists() or link.is_symlink():
            continue
        link.symlink_to(path.name)
        made.append(link)
    return made


def nvcc_version(nvcc: Path) -> str:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\bV(\d+\.\d+\.\d+)", out)
    if not m:
        raise RuntimeError(f"cannot read the version from `{nvcc} --version`:\n{out}")
    return m.group(1)


def system_candidates(env: dict[str, str] | None = None) -> list[Path]:
    """Where a machine's own toolkit may be, most explicit first."""
    env = os.environ if env is None else env
    found = [Path(env[k]) for k in ("CUDAToolkit_ROOT", "CUDA_PATH", "CUDA_HOME") if env.get(k)]
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        found.append(Path(os.path.realpath(nvcc)).parent.parent)
    found.append(Path("/usr/local/cuda"))
    unique: list[Path] = []
    for p in found:
        if p not in unique:
            unique.append(p)
    return unique


def system_toolkit(env: dict[str, str] | None = None, log=print) -> Toolkit | None:
    """The first whole toolkit on this machine, or None (saying what each candidate lacks)."""
    for root in system_candidates(env):
        if not root.is_dir():
            continue
        missing = missing_parts(root)
        if missing:
            log(f"cuda toolkit: {root} is not whole (lacks {', '.join(missing)}); not used")
            continue
        nvcc = root / "bin" / "nvcc"
        return Toolkit(root, nvcc, nvcc_version(nvcc), "system", has_driver_stub(root))
    return None


def planned_pypi(tools_root: Path) -> Toolkit:
    """The PyPI toolkit as it will be once installed (for cache keys before any download)."""
    root = pypi_dir(tools_root) / "nvidia" / "cu13"
    return Toolkit(root, root / "bin" / "nvcc", PYPI_NVCC_VERSION, "pypi", False)


def install_pypi(tools_root: Path, python: str = sys.executable, run=subprocess.run, log=print) -> Toolkit:
    """PyPI's CUDA 13 toolkit under ``tools_root``, installed once (about 1.1 GB, seconds to a minute).

    Installed into ``<key>.partial`` and renamed when whole, so an interrupted
    install is never taken for a toolkit.
    """
    final = pypi_dir(tools_root)
    planned = planned_pypi(tools_root)
    if (final / "installed.json").is_file():
        return planned
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = pip_command(partial, python)
    log("cuda toolkit: installing PyPI's CUDA 13 wheels: " + " ".join(cmd[6:]))
    run(cmd, check=True)
    root = partial / "nvidia" / "cu13"
    if not (root / "lib").is_dir():
        raise RuntimeError(f"the CUDA wheels did not install {root}/lib; is this pip able to install them?")
    links = link_unversioned(root / "lib")
    missing = missing_parts(root)
    if missing:
        raise RuntimeError(f"PyPI's CUDA wheels in {partial} lack {', '.join(missing)}")
    (partial / "installed.json").write_text(json.dumps(
        {"wheels": [list(w) for w in PYPI_WHEELS], "links": sorted(p.name for p in links)}, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    partial.replace(final)
    return planned


def resolve(tools_root: Path, from_pypi: bool = False, install: bool = True, log=print) -> Toolkit:
    """The machine's whole toolkit unless ``from_pypi``; else PyPI's (installed when ``install``)."""
    if not from_pypi:
        found = system_toolkit(log=log)
        if found:
            return found
    return install_pypi(tools_root, log=log) if install else planned_pypi(tools_root)


def cmake_args(toolkit: Toolkit, arch: str) -> list[str]:
    """Pin CMake to this toolkit and architecture (never whatever ``nvcc`` is on PATH)."""
    args = [f"-DCUDAToolkit_ROOT={toolkit.root}", f"-DCMAKE_CUDA_COMPILER={toolkit.nvcc}",
            f"-DCMAKE_CUDA_ARCHITECTURES={check_arch(arch)}"]
    if not toolkit.has_driver_stub:
        args.append("-DGGML_CUDA_NO_VMM=ON")
    return args


def key_fields(toolkit: Toolkit, arch: str) -> dict[str, object]:
    """What of the toolkit goes into a build's cache key: not its path, which is per machine."""
    return {"cuda_version": toolkit.version, "cuda_arch": arch, "cuda_vmm": toolkit.has_driver_stub}

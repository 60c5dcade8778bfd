"""The patch series applies to the pinned sdist's vendored llama.cpp, without
compiling anything.

The sdist comes the way the engine build gets it (``build_engine._fetch_sdist``:
the copy kept beside the wheel cache, else ``pip download``), and the patches
are applied by the build's own ``apply_patch_series``. No sdist and no network
is a failure that says what to do, never a skip: a series that stops applying
must not reach a cold-cache build unnoticed.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "build_engine.py"
HEADER_WORDS = ("what", "why", "upstream", "test")


def _load_build_engine():
    spec = importlib.util.spec_from_file_location("build_engine_for_patches", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_engine = _load_build_engine()
SERIES = build_engine.patch_series()
# A backend with patches of its own (packaging/patches/<backend>/) applies the common series, then those.
BACKEND_SERIES = {b: build_engine.patch_series(b) for b in build_engine.BACKENDS
                  if b == "cpu" or (build_engine.PATCH_DIR / b).is_dir()}
ALL_PATCHES = sorted({p for series in BACKEND_SERIES.values() for p in series})


def _targets(patch: Path) -> set[str]:
    """Files a patch touches, relative to vendor/llama.cpp (``-p1``)."""
    names = set()
    for line in patch.read_text().splitlines():
        m = re.match(r"^(?:---|\+\+\+) (?:a|b)/(\S+)", line)
        if m:
            names.add(m.group(1))
    return names


def _header(patch: Path) -> str:
    """Everything before the first diff; ``patch`` ignores it."""
    lines = []
    for line in patch.read_text().splitlines():
        if line.startswith(("diff ", "--- ", "Index: ")):
            break
        lines.append(line)
    return "\n".join(lines)


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    try:
        return build_engine._fetch_sdist(tmp_path_factory.mktemp("sdist"))
    except Exception as exc:  # noqa: BLE001 - any failure here means "no sdist"
        pytest.fail(
            f"the pinned llama-cpp-python {build_engine.LLAMA_CPP_PYTHON_VERSION} sdist is neither kept at "
            f"{build_engine.cached_sdist()} nor downloadable ({exc}). Run packaging/bootstrap.sh with network "
            f"access once, or copy the sdist there."
        )


@pytest.fixture(scope="module")
def pristine_tree(sdist, tmp_path_factory) -> Path:
    """Only the files the series touches, unpacked as the build would see them (never modified)."""
    root = tmp_path_factory.mktemp("tree")
    wanted = set().union(*(_targets(p) for p in ALL_PATCHES)) if ALL_PATCHES else set()
    with tarfile.open(sdist) as tar:
        for member in tar:
            parts = member.name.split("/", 3)
            if len(parts) == 4 and parts[1:3] == ["vendor", "llama.cpp"] and parts[3] in wanted:
                tar.extract(member, root, filter="data")
    tops = [p for p in root.iterdir() if p.is_dir()]
    tree = tops[0] if tops else root / "empty"
    (tree / "vendor" / "llama.cpp").mkdir(parents=True, exist_ok=True)
    return tree


@pytest.fixture()
def tree(pristine_tree, tmp_path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(pristine_tree, copy)
    return copy


def test_the_series_is_not_empty_and_named_in_order():
    assert SERIES, "packaging/patches/ has no patches, but the engine is documented as patched"
    for patch in ALL_PATCHES:
        assert re.fullmatch(r"\d{4}-[a-z0-9-]+\.patch", patch.name), patch.name


def test_a_backend_patch_is_keyed_into_its_own_backend_only():
    for backend, series in BACKEND_SERIES.items():
        own = [p for p in series if p.parent != build_engine.PATCH_DIR]
        assert all(p.parent.name == backend for p in own), (backend, own)
        others = [b for b in build_engine.BACKENDS if b != backend and not (build_engine.PATCH_DIR / b).is_dir()]
        if own and others:  # the series (and so the cache key) of a backend without the folder leaves them out
            assert not set(own) & set(build_engine.patch_series(others[0]))


@pytest.mark.parametrize("patch", ALL_PATCHES, ids=lambda p: p.relative_to(build_engine.PATCH_DIR).as_posix())
def test_each_patch_says_what_why_upstream_and_how_it_is_tested(patch):
    header = _header(patch).lower()
    missing = [w for w in HEADER_WORDS if w not in header]
    assert not missing, f"{patch.name}: its header (before the first diff) does not mention {missing}"


@pytest.mark.parametrize("backend", sorted(BACKEND_SERIES))
def test_the_series_applies_to_the_pinned_sdist_as_the_build_applies_it(tree, backend):
    build_engine.apply_patch_series(tree, backend)  # raises PatchError with patch's output otherwise
    for patch in BACKEND_SERIES[backend]:
        for name in _targets(patch):
            assert (tree / "vendor" / "llama.cpp" / name).is_file(), f"{patch.name} left no {name}"


@pytest.mark.parametrize("backend", sorted(BACKEND_SERIES))
def test_the_series_applies_without_fuzz(tree, backend):
    # The build applies with --fuzz=0 too; this says which hunk of which patch
    # only matched loosely: made against other code, it may land in the wrong place.
    vendor = tree / "vendor" / "llama.cpp"
    for patch in BACKEND_SERIES[backend]:
        proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-i", str(patch)],
                              cwd=vendor, capture_output=True, text=True)
        assert proc.returncode == 0, f"{patch.name} does not apply without fuzz:\n{proc.stdout}{proc.stderr}"

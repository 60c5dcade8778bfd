"""The chat templates llama.cpp bundles (``models/templates/*.jinja``), for tests that render them."""

from __future__ import annotations

import functools
import importlib.util
import os
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build_engine():  # noqa: ANN202  (packaging/build_engine.py, a script: loaded by path)
    spec = importlib.util.spec_from_file_location("build_engine_for_templates", ROOT / "packaging" / "build_engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def bundled_templates() -> dict[str, str]:
    """File name -> template text: from MTP_LLAMA_CPP_SRC (a vendored llama.cpp tree), else from the
    pinned sdist the engine build keeps. Neither is a failure that says what to do, never a skip: a
    template the server cannot render must not pass unseen."""
    given = os.environ.get("MTP_LLAMA_CPP_SRC", "")
    if given and (Path(given) / "models" / "templates").is_dir():
        return {p.name: p.read_text(encoding="utf-8") for p in (Path(given) / "models" / "templates").glob("*.jinja")}
    sdist = _build_engine().cached_sdist()
    if not sdist.is_file():
        pytest.fail(f"the pinned llama-cpp-python sdist is not at {sdist}: run packaging/bootstrap.sh once "
                    f"(it keeps it there), or set MTP_LLAMA_CPP_SRC to a vendored llama.cpp tree")
    templates = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            if "/vendor/llama.cpp/models/templates/" in member.name and member.name.endswith(".jinja"):
                templates[Path(member.name).name] = tar.extractfile(member).read().decode("utf-8")
    assert len(templates) > 50, f"only {len(templates)} templates in {sdist}"
    return templates

"""The engine's build record, read without loading llama.cpp.

``packaging/build_engine.py`` writes ``mtp-studio-engine.json`` into the
environment it installs the engine into; ``packaging/build_engine_libs.py``
writes the same file for an installer's engine and the freezer puts it where
``sys.prefix`` points in the frozen app. The About box and ``--version`` read
it here, in the GUI process, where llama_cpp must never be imported.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

RECORD_NAME = "mtp-studio-engine.json"


def record_path() -> Path:
    return Path(sys.prefix) / RECORD_NAME


def read_record(path: Path | None = None) -> dict[str, Any]:
    """The record's contents, or ``{}`` when there is none or it is unreadable."""
    try:
        data = json.loads((path or record_path()).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def app_version() -> str:
    try:
        return importlib.metadata.version("mtp-studio")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def describe(record: dict[str, Any]) -> list[str]:
    """Lines for people: version, backend and how backends load, the patch series."""
    if not record:
        return ["engine build: no build record (not installed by packaging/build_engine.py)"]
    loading = record.get("backend_loading", "linked in")
    lines = [f"engine: llama-cpp-python {record.get('llama_cpp_python', '?')}, backend {record.get('backend', '?')}"
             f" ({'backends and CPU variants chosen at run time' if loading == 'dynamic' else 'built for this CPU'})"]
    if record.get("cpu_variants"):
        lines.append("CPU variants: " + ", ".join(record["cpu_variants"]))
    patches = record.get("patches") or []
    lines.append(f"patches ({record.get('patch_hash', '?')}): " + (", ".join(patches) if patches else "none"))
    return lines


def engine_patches(eng: dict) -> str:
    """The engine build's patch series in one line: hash and file names (packaging/patches/)."""
    names = eng.get("patches")
    if names is None:
        text = "unknown (no build record)"
    else:
        text = f"series {eng.get('patch_hash')}: " + (", ".join(names) if names else "none (pristine llama.cpp)")
    if eng.get("lib_path"):
        text += f"; but libllama comes from LLAMA_CPP_LIB_PATH={eng['lib_path']}"
    return text


def version_text() -> str:
    """What ``mtp-studio --version`` prints."""
    return "\n".join([f"MTP Studio {app_version()}", *describe(read_record())])

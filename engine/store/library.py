"""The models on disk: the Hugging Face cache and folders the user adds,
each GGUF described from its header (nothing is loaded)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.errors import ModelFileError
from engine.gguf.facts import GGUFFacts, read_facts
from engine.store.projectors import PROJECTOR_ARCH, ProjectorFacts, is_projector_name, read_projector

_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


@dataclass(frozen=True)
class LibraryEntry:
    path: Path
    facts: GGUFFacts | None
    problem: str | None = None

    @property
    def is_projector(self) -> bool:
        """A vision projector (``mmproj``), by llama.cpp's naming rule or its ``clip`` header: never a model."""
        return is_projector_name(self.path) or (self.facts is not None and self.facts.architecture == PROJECTOR_ARCH)

    @property
    def layout(self) -> str:
        """What the file is, in the words the library shows (see ``layout_label``)."""
        return layout_label(self.facts) if self.facts else "unreadable"


def layout_label(facts: GGUFFacts) -> str:
    """The file's MTP layout for a list, telling a broken sidecar from a trunk-only export.

    ``GGUFFacts.layout`` looks for the NextN blocks where the metadata says they are. A sidecar whose blocks
    are numbered from 0 (or whose metadata counts only its heads) has them elsewhere, so it would read as
    "trunk-only" (or "combined") — the opposite of what it is, and a user would never run the doctor on it.
    """
    has_heads = any(".nextn." in name for name in facts.tensor_names)
    if has_heads and (facts.layout == "trunk-only" or (facts.layout == "combined" and facts.trunk_layers == 0)):
        return "MTP sidecar, blocks misnumbered: check it with the doctor, Repair fixes it"
    return {"mtp-only": "MTP sidecar"}.get(facts.layout, facts.layout)


def folders_file() -> Path:
    return paths.config_dir() / "library.json"


def folders() -> list[Path]:
    try:
        data = json.loads(folders_file().read_text())
    except (OSError, ValueError):
        data = {}
    return [Path(p) for p in data.get("folders", [])]


def add_folder(folder: str | Path) -> None:
    current = [str(p) for p in folders()]
    folder = str(Path(folder).expanduser().resolve())
    if folder not in current:
        current.append(folder)
    tmp = folders_file().with_suffix(".partial")
    tmp.write_text(json.dumps({"folders": current}, indent=2))
    os.replace(tmp, folders_file())


def hub_cache() -> Path:
    from huggingface_hub.constants import HF_HUB_CACHE

    return Path(HF_HUB_CACHE)


def _candidates(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    # only the first shard stands for a split model
    return sorted(p for p in root.rglob("*.gguf") if not (_SHARD.search(p.name) and "-00001-of-" not in p.name))


@dataclass(frozen=True)
class ProjectorEntry:
    path: Path
    facts: ProjectorFacts | None
    problem: str | None = None


def scan(extra: list[Path] | None = None) -> list[LibraryEntry]:
    """The models on disk; vision projectors are not among them (see :func:`scan_projectors`)."""
    return [e for e in _scan_all(extra) if not e.is_projector]


def scan_projectors(extra: list[Path] | None = None) -> list[ProjectorEntry]:
    """The vision projectors on disk (``mmproj-*.gguf``, or any GGUF with a ``clip`` header)."""
    out = []
    for e in _scan_all(extra):
        if not e.is_projector:
            continue
        try:
            out.append(ProjectorEntry(e.path, read_projector(e.path)))
        except ModelFileError as exc:
            out.append(ProjectorEntry(e.path, None, str(exc)))
    return out


def projectors_beside(model: str | Path) -> list[Path]:
    """The projector files in a model's folder: where its repository (and llama.cpp's downloader) puts them."""
    folder = Path(model).parent
    return sorted(p for p in folder.glob("*.gguf") if is_projector_name(p)) if folder.is_dir() else []


def _scan_all(extra: list[Path] | None) -> list[LibraryEntry]:
    roots = [hub_cache(), paths.data_dir() / "models", *folders(), *(extra or [])]
    seen: set[Path] = set()
    entries = []
    for root in roots:
        for path in _candidates(root):
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            entries.append(_entry(path))
    return entries


def _entry(path: Path) -> LibraryEntry:
    """One file's entry; a file that cannot be read is listed with the reason, never
    raised: one bad file among many must not end ``models list`` or empty the Models page."""
    try:
        return LibraryEntry(path, read_facts(path))
    except ModelFileError as exc:
        return LibraryEntry(path, None, str(exc))
    except Exception as exc:  # a reader bug on this one file: say so, keep scanning
        return LibraryEntry(path, None, f"could not be read ({type(exc).__name__}: {exc}); "
                                        "please report this file.")

"""Finding GGUF models on the Hugging Face hub: search, a repository's files
grouped by quantization, and which MTP sidecar goes with a target.

Everything goes through ``huggingface_hub``; ``HF_ENDPOINT`` (or ``endpoint=``)
points it elsewhere, which is how the tests use a server on loopback.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CATALOG = Path(__file__).resolve().parents[2] / "assets" / "catalog.json"
_QUANT = re.compile(r"(UD-)?(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)", re.IGNORECASE)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class RepoSummary:
    repo_id: str
    downloads: int
    likes: int


@dataclass
class FileGroup:
    """One quantization of a model: one file, or every shard of a split model."""

    quant: str
    files: list[str] = field(default_factory=list)
    size: int = 0
    is_mtp: bool = False

    @property
    def shards(self) -> int:
        return len(self.files)


def search(query: str, limit: int = 20, endpoint: str | None = None, token: str | None = None) -> list[RepoSummary]:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=_endpoint(endpoint), token=token)
    return [RepoSummary(m.id, int(getattr(m, "downloads", 0) or 0), int(getattr(m, "likes", 0) or 0))
            for m in api.list_models(search=query, filter="gguf", limit=limit)]


def quant_of(filename: str) -> str:
    stem = _SHARD.sub("", Path(filename).name).removesuffix(".gguf")
    matches = _QUANT.findall(stem)
    return ("".join(matches[-1])).upper() if matches else "unknown"


def group_files(siblings: list[tuple[str, int]]) -> list[FileGroup]:
    """Group ``(filename, size)`` pairs into quantizations; shards go together; MTP files apart."""
    groups: dict[tuple[str, bool, str], FileGroup] = {}
    for name, size in siblings:
        if not name.endswith(".gguf"):
            continue
        is_mtp = "mtp" in Path(name).name.lower()
        base = _SHARD.sub("", name)
        key = (quant_of(name), is_mtp, base if _SHARD.search(name) else name)
        group = groups.setdefault(key, FileGroup(quant_of(name), is_mtp=is_mtp))
        group.files.append(name)
        group.size += size
    for g in groups.values():
        g.files.sort()
    return sorted(groups.values(), key=lambda g: (g.is_mtp, g.size))


def repo_files(repo_id: str, endpoint: str | None = None, token: str | None = None) -> list[FileGroup]:
    from huggingface_hub import HfApi

    info = HfApi(endpoint=_endpoint(endpoint), token=token).model_info(repo_id, files_metadata=True)
    return group_files([(s.rfilename, int(s.size or 0)) for s in info.siblings or []])


def catalog() -> list[dict[str, Any]]:
    return list(json.loads(CATALOG.read_text())["families"])


def suggest_sidecar(repo_id: str, groups: list[FileGroup]) -> tuple[str, str] | None:
    """(repo, file pattern) of the MTP sidecar for a target in ``repo_id``.

    First an ``mtp-*.gguf`` sibling in the same repository (the naming
    llama.cpp's ``--mtp`` export and its downloader use), then the catalog.
    """
    for g in groups:
        if g.is_mtp:
            return repo_id, g.files[0]
    for family in catalog():
        if repo_id in family.get("targets", []):
            side = family.get("sidecar")
            if side:
                return side["repo"], side.get("pattern", "*mtp*.gguf")
    return None


def _endpoint(endpoint: str | None) -> str | None:
    """``HF_ENDPOINT`` is read per call (huggingface_hub reads it once, at import)."""
    return endpoint or os.environ.get("HF_ENDPOINT") or None

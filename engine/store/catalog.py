"""The catalog of known MTP families (``assets/catalog.json``), read and checked
as types: what the Models page shows as "Recommended MTP models" before (and
without) any network, and which files "Download" fetches once online.

Offline, a recommendation's size is the catalog's own approximate figure, and
its fit badge is ``engine.store.fit``'s verdict on those weights against this
machine's memory. Online, ``resolve`` asks the hub which files match the
recommended quantization and the sidecar pattern, with their real sizes.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.store import fit, hub

CATALOG = Path(__file__).resolve().parents[2] / "assets" / "catalog.json"
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
MTP_KINDS = ("in-file", "sidecar")


class CatalogError(EngineError):
    kind = "catalog"


@dataclass(frozen=True)
class Sidecar:
    repo: str
    pattern: str
    size: int | None


@dataclass(frozen=True)
class Recommendation:
    """One family's recommended download: a target quantization and, for sidecar families, its MTP sidecar."""

    name: str
    arch: str
    mtp: str  # "in-file" | "sidecar"
    repo: str
    quant: str
    size: int | None  # the target's approximate bytes, None when the catalog cannot justify a figure
    size_basis: str
    sidecar: Sidecar | None
    note: str

    @property
    def total_size(self) -> int | None:
        """Target plus sidecar bytes, or None when either is unknown."""
        if self.size is None or (self.sidecar is not None and self.sidecar.size is None):
            return None
        return self.size + (self.sidecar.size or 0 if self.sidecar else 0)


@dataclass(frozen=True)
class Resolved:
    """The files a recommendation downloads, as the hub lists them: ``(repo, filename, size)`` each."""

    target: list[tuple[str, str, int]]
    sidecar: list[tuple[str, str, int]]
    # the vision projector the target's repository ships (mmproj-*.gguf), downloaded beside the target where the
    # load sheet offers it; empty for a text-only model
    projector: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(s for _r, _f, s in self.target + self.sidecar + self.projector)

    @property
    def files(self) -> list[tuple[str, str]]:
        return [(r, f) for r, f, _s in self.target + self.sidecar + self.projector]


def problems(data: Any) -> list[str]:
    """Everything wrong with a catalog's contents, as sentences (empty when it is fine).

    Checked here rather than trusted at use: a typo in a repository name or a missing sidecar would otherwise
    surface as a 404 in the middle of a user's download.
    """
    if not isinstance(data, dict) or not isinstance(data.get("families"), list):
        return ["the catalog must be an object with a list of families"]
    out = []
    for i, fam in enumerate(data["families"]):
        where = f"family {i + 1} ({fam.get('name', '?') if isinstance(fam, dict) else '?'})"
        if not isinstance(fam, dict):
            out.append(f"{where} is not an object")
            continue
        for key in ("name", "arch", "targets", "mtp", "recommended"):
            if key not in fam:
                out.append(f"{where} has no {key!r}")
        if fam.get("mtp") not in MTP_KINDS:
            out.append(f"{where}: 'mtp' must be one of {MTP_KINDS}")
        if (fam.get("mtp") == "sidecar") != ("sidecar" in fam):
            out.append(f"{where}: a 'sidecar' entry belongs exactly to families with mtp 'sidecar'")
        for repo in fam.get("targets", []):
            if not _REPO.match(str(repo)):
                out.append(f"{where}: {repo!r} is not an owner/name repository")
        rec = fam.get("recommended") or {}
        if rec and rec.get("repo") not in fam.get("targets", []):
            out.append(f"{where}: the recommended repository is not one of its targets")
        side = fam.get("sidecar") or {}
        if side and not _REPO.match(str(side.get("repo", ""))):
            out.append(f"{where}: the sidecar repository {side.get('repo')!r} is not owner/name")
        for label, entry in (("recommended", rec), ("sidecar", side)):
            size = entry.get("size") if entry else None
            if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
                out.append(f"{where}: the {label} size must be a positive number of bytes or null")
            if label == "recommended" and size is not None and not entry.get("size_basis"):
                out.append(f"{where}: a size needs a 'size_basis' saying where the figure comes from")
    return out


def load(path: str | Path | None = None) -> list[Recommendation]:
    """The catalog's recommendations.

    Raises:
        CatalogError: the file is missing, not JSON, or fails ``problems`` (named, with the file).
    """
    path = Path(path) if path else CATALOG
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CatalogError(f"The model catalog {path} cannot be read ({exc}); reinstall MTP Studio.") from exc
    found = problems(data)
    if found:
        raise CatalogError(f"The model catalog {path} is malformed: {'; '.join(found)}.")
    out = []
    for fam in data["families"]:
        rec, side = fam["recommended"], fam.get("sidecar")
        out.append(Recommendation(
            name=fam["name"], arch=fam["arch"], mtp=fam["mtp"], repo=rec["repo"], quant=rec.get("quant", "Q4_K_M"),
            size=rec.get("size"), size_basis=rec.get("size_basis", ""),
            sidecar=Sidecar(side["repo"], side.get("pattern", "*mtp*.gguf"), side.get("size")) if side else None,
            note=fam.get("note", "")))
    return out


def fit_estimate(size: int | None, available: int | None = None) -> fit.MemoryEstimate | None:
    """``fit``'s estimate from the weights' size alone (what is known before the header is on disk), against
    this machine's memory; None when the size is unknown. The KV cache and compute buffers come on top: the
    "tight" margin (over 80 %) is what leaves room for them."""
    if size is None:
        return None
    return fit.MemoryEstimate(weights=size, kv_cache=0, recurrent=0, mtp_context=0, compute=0,
                              available=available if available is not None else fit.available_memory())


def badge(estimate: fit.MemoryEstimate | None) -> str:
    """The fit badge's words."""
    if estimate is None:
        return "size unknown"
    return {"fits": "fits", "tight": "tight fit", "won't fit": "does not fit"}.get(estimate.verdict,
                                                                                   "memory unknown")


def resolve(rec: Recommendation, endpoint: str | None = None, token: str | None = None) -> Resolved:
    """The files to download for ``rec``, from the hub's listings (every shard of the target quantization).

    Raises:
        HubUnreachable: offline (within about 3 s).
        CatalogError: the repository no longer has that quantization, or no file matches the sidecar pattern.
    """
    listed = hub.repo_files(rec.repo, endpoint, token)
    groups = [g for g in listed if not g.is_mtp and not g.is_projector]
    chosen = [g for g in groups if g.quant == rec.quant.upper()]
    if not chosen:
        have = ", ".join(sorted({g.quant for g in groups})) or "no GGUF files"
        raise CatalogError(f"{rec.repo} has no {rec.quant} files (it has {have}). Search for it and pick "
                           "another quantization.")
    # a group's size is its shards' sum; each shard is shown with an even share of it
    target = [(rec.repo, name, chosen[0].size // len(chosen[0].files)) for name in chosen[0].files]
    sidecar: list[tuple[str, str, int]] = []
    if rec.sidecar is not None:
        side_groups = hub.repo_files(rec.sidecar.repo, endpoint, token)
        matching = [g for g in side_groups if any(fnmatch.fnmatch(Path(f).name, rec.sidecar.pattern)
                                                  for f in g.files)]
        if not matching:
            raise CatalogError(f"{rec.sidecar.repo} has no file matching {rec.sidecar.pattern}; the sidecar may "
                               "have moved. Search for the model's MTP sidecar instead.")
        same_quant = [g for g in matching if g.quant == rec.quant.upper()]
        pick = (same_quant or sorted(matching, key=lambda g: g.size))[0]
        sidecar = [(rec.sidecar.repo, name, pick.size // len(pick.files)) for name in pick.files]
    # a vision model's projector: F16 as llama.cpp's converter writes it by default, else the smallest
    projectors = sorted((g for g in listed if g.is_projector), key=lambda g: (g.quant != "F16", g.size))
    projector = [(rec.repo, name, projectors[0].size // len(projectors[0].files)) for name in projectors[0].files] \
        if projectors else []
    return Resolved(target, sidecar, projector)

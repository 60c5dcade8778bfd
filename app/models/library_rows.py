"""The library's rows: every model on disk and every catalog model not downloaded yet, each with what a
user picks a model by (architecture, quantization, size, MTP head or sidecar, fits this machine, last used),
and the filters over them. No Qt: the rows are made on the background runner and tested as plain values."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.store import catalog, fit, library

# the quantization a file's name states, as the converters and uploaders write it
_QUANT = re.compile(r"(?<![A-Za-z0-9])(UD-)?(I?Q\d(?:_[0-9A-Z]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
                    re.IGNORECASE)
WHERE_CHOICES = ("all", "disk", "catalog")


@dataclass(frozen=True)
class LibraryRow:
    name: str  # the file's name, or the catalog family's
    path: str | None  # None: in the catalog only
    architecture: str
    quantization: str
    size: int | None  # bytes (the catalog's approximate figure for a model not downloaded)
    mtp: str  # what the file holds, in the list's words
    has_mtp: bool  # an MTP head in the file, or a sidecar (on disk or in the catalog)
    fits: bool | None  # the weights fit this machine's memory (None: unknown)
    last_used: float | None = None
    problem: str | None = None  # why the file could not be read
    repo: str | None = None  # the catalog's repository

    @property
    def on_disk(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class LibraryFilter:
    text: str = ""  # words that must all appear in the name, architecture, quantization or MTP status
    where: str = "all"  # all | disk | catalog
    mtp_only: bool = False
    fits_only: bool = False
    architecture: str = ""  # "" any
    quantization: str = ""  # "" any

    def matches(self, row: LibraryRow) -> bool:
        if (self.where == "disk" and not row.on_disk) or (self.where == "catalog" and row.on_disk):
            return False
        if (self.mtp_only and not row.has_mtp) or (self.fits_only and row.fits is not True):
            return False
        if (self.architecture and row.architecture != self.architecture) or \
                (self.quantization and row.quantization != self.quantization):
            return False
        haystack = " ".join((row.name, row.architecture, row.quantization, row.mtp, row.repo or "")).lower()
        return all(word in haystack for word in self.text.lower().split())


def quantization_of(entry: library.LibraryEntry) -> str:
    """The quantization the name states (``Q4_K_M``), else the header's most common weight type."""
    found = _QUANT.search(entry.path.name)
    if found:
        return found.group(0).upper()
    if entry.facts is None:
        return "?"
    weights = {t: n for t, n in entry.facts.quantization.items() if t.upper() not in ("F32",)}
    return max(weights, key=lambda t: weights[t]).upper() if weights else "F32"


def _disk_row(entry: library.LibraryEntry, available: int | None, used: Mapping[str, float]) -> LibraryRow:
    from app.models.presets import key

    facts = entry.facts
    if facts is None:
        return LibraryRow(entry.path.name, str(entry.path), "?", "?", None, "unreadable", False, None,
                          used.get(key(entry.path)), entry.problem)
    layout = entry.layout
    mtp = {"combined": f"MTP head in the file ({facts.nextn_layers})", "plain": "no MTP head",
           "trunk-only": "no MTP head (trunk-only: needs its sidecar)"}.get(layout, layout)
    estimate = fit.MemoryEstimate(weights=facts.file_size, kv_cache=0, recurrent=0, mtp_context=0, compute=0,
                                  available=available) if available else None
    return LibraryRow(entry.path.name, str(entry.path), facts.architecture, quantization_of(entry), facts.file_size,
                      mtp, facts.has_mtp or layout != "plain", _fits(estimate), used.get(key(entry.path)))


def _catalog_row(rec: catalog.Recommendation, available: int | None) -> LibraryRow:
    estimate = catalog.fit_estimate(rec.total_size, available) if available else None
    mtp = "MTP head in the file" if rec.mtp == "in-file" else "MTP sidecar (downloaded with it)"
    return LibraryRow(rec.name, None, rec.arch, rec.quant.upper(), rec.total_size, mtp, True, _fits(estimate),
                      repo=rec.repo)


def _fits(estimate: fit.MemoryEstimate | None) -> bool | None:
    if estimate is None or estimate.verdict not in ("fits", "tight", "won't fit"):
        return None
    return estimate.verdict != "won't fit"


def make_rows(entries: Iterable[library.LibraryEntry], recommendations: Iterable[catalog.Recommendation],
              used: Mapping[str, float], available: int | None) -> list[LibraryRow]:
    """The files on disk (most recently used first, then by name), then the catalog's models whose
    repository has no file on disk yet."""
    disk = [_disk_row(e, available, used) for e in entries]
    disk.sort(key=lambda r: (-(r.last_used or 0.0), r.name.lower()))
    have = " ".join(r.path or "" for r in disk)
    # the hub cache keeps a repository's files under models--owner--name
    wanted = [rec for rec in recommendations if "models--" + rec.repo.replace("/", "--") not in have]
    return disk + [_catalog_row(rec, available) for rec in wanted]


def scan_rows(used: Mapping[str, float]) -> list[LibraryRow]:
    """Scan the disk and read the catalog (slow: run it on the background runner)."""
    try:
        recommendations = catalog.load()
    except catalog.CatalogError:
        recommendations = []  # the Recommended list says why
    return make_rows(library.scan(), recommendations, used, fit.available_memory())


def size_text(size: int | None) -> str:
    if size is None:
        return "size unknown"
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"


def when_text(when: float | None, now: float | None = None) -> str:
    if when is None:
        return "never used"
    days = int(((time.time() if now is None else now) - when) // 86400)
    if days <= 0:
        return "used today"
    return "used yesterday" if days == 1 else f"used {days} days ago"


def label(row: LibraryRow, now: float | None = None) -> str:
    """One line of the list: the name first (two spaces after it), then what it is."""
    if row.problem is not None and not row.on_disk:
        return f"{row.name}  ·  {row.problem}"
    if row.architecture == "?" and row.on_disk:
        return f"{row.name}  ·  unreadable"
    where = when_text(row.last_used, now) if row.on_disk else "in the catalog, not downloaded"
    fits = {True: "", False: " · does not fit this machine", None: ""}[row.fits]
    return (f"{row.name}  ·  {row.architecture} · {row.quantization} · {size_text(row.size)} · {row.mtp} · "
            f"{where}{fits}")

"""The library's rows: every model on disk and every catalog model not downloaded yet, each with what a
user picks a model by (architecture, quantization, size, MTP head or sidecar, fits this machine, last used,
the autotune profile, the doctor's word on a sidecar pair, the vision projector beside it), and the filters
over them. No Qt: the rows are
made on the background runner and tested as plain values.

The doctor's word comes from the headers already read for the list (``engine.store.doctor``, the load
check's own rules): a model without a head is paired with each sidecar of its
architecture on disk, and a sidecar with each such model; the best verdict is shown. The autotune profile
is found by the file's path (no 16 MiB hash per file): the newest one, and whether it was measured on
another machine."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from engine.autotune.profiles import Profile, ProfileStore
from engine.errors import ModelFileError
from engine.store import catalog, fit, library
from engine.store.doctor import diagnose_facts
from engine.store.projectors import ProjectorFacts, read_projector, target_input_width

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
    autotune: str = ""  # the autotune profile in words ("" when none was made)
    doctor: str = ""  # the doctor's word on this file's sidecar pairing ("" where there is none to give)
    projector: str | None = None  # a vision projector beside the file that fits it (None: none there)

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
        haystack = " ".join((row.name, row.architecture, row.quantization, row.mtp, row.repo or "", row.autotune,
                             row.doctor, vision_text(row))).lower()
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


def _is_sidecar(entry: library.LibraryEntry) -> bool:
    return entry.facts is not None and entry.layout.startswith("MTP sidecar")


def doctor_notes(entries: Iterable[library.LibraryEntry]) -> dict[str, str]:
    """Path -> the doctor's word, for models without a head that have a sidecar of their architecture on disk
    (and trunk-only exports, which need one) and for sidecars: the best pairing found."""
    readable = [e for e in entries if e.facts is not None and not e.is_projector]
    sidecars = [e for e in readable if _is_sidecar(e)]
    targets = [e for e in readable if not _is_sidecar(e) and e.layout in ("plain", "trunk-only")]
    ranked: dict[str, tuple[int, str]] = {}  # path -> (0 fits, 1 Repair fixes it, 2 does not fit; the other)
    for target in targets:
        for sidecar in sidecars:
            assert target.facts is not None and sidecar.facts is not None
            if target.facts.architecture != sidecar.facts.architecture:
                continue
            diagnosis = diagnose_facts(target.facts, sidecar.facts)
            rank = 0 if diagnosis.ok else 1 if diagnosis.repairable else 2
            for one, other in ((target, sidecar), (sidecar, target)):
                key_ = str(one.path)
                if key_ not in ranked or rank < ranked[key_][0]:
                    ranked[key_] = (rank, other.path.name)
    notes = {}
    for entry in targets + sidecars:
        found = ranked.get(str(entry.path))
        if found is None:
            if _is_sidecar(entry) or entry.layout == "trunk-only":
                notes[str(entry.path)] = "doctor: no model on disk to pair with" if _is_sidecar(entry) \
                    else "doctor: no sidecar for it on disk"
            continue
        rank, other = found
        pairing = f"with {other}" if _is_sidecar(entry) else f"sidecar {other}"
        notes[str(entry.path)] = ("doctor: " + pairing + (" fits", " needs Repair", " does not fit")[rank])
    return notes


def projectors_for(entries: Iterable[library.LibraryEntry]) -> dict[str, str]:
    """Model path -> the vision projector beside it (its repository's ``mmproj-*.gguf``) that fits it: it encodes
    images into rows as wide as the model takes (the doctor's width check, from the headers)."""
    read: dict[str, ProjectorFacts | None] = {}
    found = {}
    for entry in entries:
        if entry.facts is None or entry.is_projector or _is_sidecar(entry):
            continue
        for path in library.projectors_beside(entry.path):
            if str(path) not in read:
                try:
                    read[str(path)] = read_projector(path)
                except (ModelFileError, OSError):
                    read[str(path)] = None
            facts = read[str(path)]
            try:
                width = target_input_width(entry.facts)
            except (ModelFileError, OSError):
                continue
            if facts is not None and facts.vision and facts.width in (None, width):
                found[str(entry.path)] = str(path)
                break
    return found


def vision_text(row: LibraryRow) -> str:
    return f"vision: {os.path.basename(row.projector)}" if row.projector else ""


def autotune_notes(profiles: Iterable[Profile], fingerprint: str | None) -> dict[str, str]:
    """Model path -> its newest autotune profile in words: the speedup and setting, or that it was measured on
    another machine (``fingerprint``: this one's, when known)."""
    newest: dict[str, Profile] = {}
    for p in profiles:
        if p.model_path not in newest or p.created > newest[p.model_path].created:
            newest[p.model_path] = p
    notes = {}
    for path, p in newest.items():
        if fingerprint and p.fingerprint != fingerprint:
            notes[path] = "autotuned on another machine"
        else:
            notes[path] = f"autotuned {p.speedup:.2f}× ({p.setting.label})"
    return notes


def make_rows(entries: Iterable[library.LibraryEntry], recommendations: Iterable[catalog.Recommendation],
              used: Mapping[str, float], available: int | None, autotune: Mapping[str, str] | None = None,
              ) -> list[LibraryRow]:
    """The files on disk (most recently used first, then by name), then the catalog's models whose
    repository has no file on disk yet. ``autotune``: path -> the profile in words (:func:`autotune_notes`)."""
    entries = list(entries)
    doctor = doctor_notes(entries)
    projectors = projectors_for(entries)
    disk = [replace(_disk_row(e, available, used), autotune=(autotune or {}).get(str(e.path), ""),
                    doctor=doctor.get(str(e.path), ""), projector=projectors.get(str(e.path))) for e in entries]
    disk.sort(key=lambda r: (-(r.last_used or 0.0), r.name.lower()))
    have = " ".join(r.path or "" for r in disk)
    # the hub cache keeps a repository's files under models--owner--name, the app's downloads under owner__name
    wanted = [rec for rec in recommendations if "models--" + rec.repo.replace("/", "--") not in have
              and f"{os.sep}{rec.repo.replace('/', '__')}{os.sep}" not in have]
    return disk + [_catalog_row(rec, available) for rec in wanted]


def scan_rows(used: Mapping[str, float], fingerprint: str | None = None) -> list[LibraryRow]:
    """Scan the disk and read the catalog and the autotune profiles (slow: run it on the background runner)."""
    try:
        recommendations = catalog.load()
    except catalog.CatalogError:
        recommendations = []  # the Recommended list says why
    return make_rows(library.scan(), recommendations, used, fit.available_memory(),
                     autotune_notes(ProfileStore().profiles(), fingerprint))


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
    extra = "".join(f" · {note}" for note in (row.doctor, vision_text(row), row.autotune) if note)
    return (f"{row.name}  ·  {row.architecture} · {row.quantization} · {size_text(row.size)} · {row.mtp} · "
            f"{where}{fits}{extra}")

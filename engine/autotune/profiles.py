"""Tuned settings, remembered per (hardware fingerprint, model file, engine build).

A profile applies only while all three are unchanged; when one changes, the
old profile is *stale* and the app offers to tune again.

Profiles carry the version of the search that made them
(:data:`PROFILE_VERSION`). An older profile stays valid — its setting is
still a measured, never-slower choice — but it was chosen among fewer
policies, so it is *outdated*: the app and CLI say what it did not try and
offer to tune again.

Versions: 1 (no field): off and fixed MTP depths. 2: also adaptive depth,
n-gram drafting, MTP + n-gram, and the thread counts (``threads``,
``threads_draft``; 0 = not measured, keep the load settings). 3: measured
with a sampling preset (``sampling``, a key of
:func:`engine.sampling.sampling_key`; earlier files were greedy) and, where
asked, at several concurrencies (``concurrency``: the choice for N sequences
decoded together; earlier files hold only N = 1, ``setting``). Within 3, a
profile may carry the MTP head's draft vocabulary (``draft_vocab``; absent:
not measured, the load settings stay).

Profiles are keyed by sampling too: drafts are accepted differently at
temperature 0.6 with penalties than greedily, so a speedup measured with one
does not hold for the other. The key of a greedy profile is the key files
had before sampling was part of it, so old profiles read as greedy ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine import paths
from engine.sampling import GREEDY_KEY
from engine.speculative.settings import SpeculativeSettings

HASH_SPAN = 8 << 20  # bytes read from each end of the file
PROFILE_VERSION = 3
OUTDATED_TEXT = ("made by an older autotune that tried only fixed MTP depths (not adaptive depth, n-gram drafting "
                 "or thread counts); it still applies — tune again to try the rest")
OUTDATED_TEXTS = {  # by the version that made it
    1: OUTDATED_TEXT,
    2: ("made by an older autotune that measured greedy decoding only, one reply at a time; it still applies — "
        "tune again to measure with the chat's sampling and with several requests at once"),
}


def model_identity(path: str | Path) -> str:
    """A content hash of a model file that is cheap for 100 GB files: size plus
    the first and last 8 MiB (header, tokenizer, and the tail of the weights)."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        digest.update(f.read(HASH_SPAN))
        if size > 2 * HASH_SPAN:
            f.seek(size - HASH_SPAN)
            digest.update(f.read(HASH_SPAN))
    return digest.hexdigest()[:20]


@dataclass(frozen=True)
class ConcurrencyChoice:
    """What autotune chose for N sequences decoded together, and its total speed relative to "off"."""

    setting: SpeculativeSettings
    speedup: float

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting.to_json(), "speedup": self.speedup}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConcurrencyChoice:
        return cls(SpeculativeSettings.from_json(data.get("setting") or {}), float(data.get("speedup") or 1.0))


def profile_key(fingerprint: str, model_hash: str, engine: str, sampling: str = GREEDY_KEY) -> str:
    """The store's key; a greedy profile's is the key made before sampling was part of it."""
    base = f"{fingerprint}:{model_hash}:{engine}"
    return base if sampling == GREEDY_KEY else f"{base}:{sampling}"


@dataclass(frozen=True)
class Profile:
    fingerprint: str
    model_hash: str
    engine: str
    model_path: str
    setting: SpeculativeSettings
    speedup: float
    reason: str
    created: float
    threads: int = 0  # decode/verify threads autotune chose; 0: not measured
    threads_draft: int = 0  # MTP draft context threads; 0: the same as threads
    version: int = 1  # the search that made it (PROFILE_VERSION); files without the field are 1
    sampling: str = GREEDY_KEY  # the sampling it was measured with (sampling_key); files without it: greedy
    # N sequences decoded together -> the choice for N, where measured (N = 1 is ``setting``)
    concurrency: dict[int, ConcurrencyChoice] = field(default_factory=dict)
    # the MTP head's draft vocabulary autotune chose (0: the whole one); None: not measured
    draft_vocab: int | None = None

    def setting_for(self, parallel: int) -> SpeculativeSettings:
        """The choice for ``parallel`` sequences at once: the one measured at the largest concurrency not
        above it (a server with 3 slots gets the choice for 2), else ``setting`` (measured alone)."""
        measured = [n for n in self.concurrency if n <= parallel]
        return self.concurrency[max(measured)].setting if measured else self.setting

    @property
    def outdated(self) -> bool:
        """Made by an older search: still valid, but chosen among fewer policies."""
        return self.version < PROFILE_VERSION

    @property
    def outdated_text(self) -> str:
        """What an outdated profile did not measure, in words ("" when it is current)."""
        return OUTDATED_TEXTS.get(self.version, OUTDATED_TEXT) if self.outdated else ""

    @property
    def key(self) -> str:
        return profile_key(self.fingerprint, self.model_hash, self.engine, self.sampling)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "setting": self.setting.to_json(),
                "concurrency": {str(n): c.to_json() for n, c in sorted(self.concurrency.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        """A stored profile; files written before the settings had one type, before sampling or before
        concurrency was measured still read (as greedy, concurrency 1)."""
        known = {f.name for f in fields(cls)} - {"setting", "concurrency"}
        concurrency = data.get("concurrency") or {}
        return replace(cls(**{**{k: v for k, v in data.items() if k in known}, "setting": SpeculativeSettings()}),
                       setting=SpeculativeSettings.from_json(data.get("setting") or {}),
                       concurrency={int(n): ConcurrencyChoice.from_json(c) for n, c in concurrency.items()}
                       if isinstance(concurrency, dict) else {})


@dataclass(frozen=True)
class ProfileMatch:
    """What the store knows for one model on this machine and engine build."""

    profile: Profile | None  # the profile that applies now
    stale: bool  # profiles exist for this file, made on other hardware, engine or contents


class ProfileStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.data_dir() / "autotune-profiles.json"

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, profile: Profile) -> None:
        data = self._load()
        data[profile.key] = profile.to_json()
        tmp = self.path.with_suffix(".partial")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.path)

    def find(self, fingerprint: str, model_hash: str, engine: str, sampling: str | None = GREEDY_KEY,
             ) -> Profile | None:
        """The profile measured with ``sampling``; with ``sampling`` None, the newest one of any sampling."""
        if sampling is not None:
            raw = self._load().get(profile_key(fingerprint, model_hash, engine, sampling))
            return Profile.from_json(raw) if raw else None
        return max(self.all_for(fingerprint, model_hash, engine), key=lambda p: p.created, default=None)

    def profiles(self) -> list[Profile]:
        """Every stored profile (the model library names each file's, by path, without hashing it)."""
        return [Profile.from_json(raw) for raw in self._load().values() if isinstance(raw, dict)]

    def all_for(self, fingerprint: str, model_hash: str, engine: str) -> list[Profile]:
        """Every sampling's profile for this machine, model contents and engine build."""
        return [p for p in map(Profile.from_json, self._load().values())
                if (p.fingerprint, p.model_hash, p.engine) == (fingerprint, model_hash, engine)]

    def stale_for(self, model_path: str, fingerprint: str, model_hash: str, engine: str) -> list[Profile]:
        """Profiles of this model file made on other hardware, engine or file contents."""
        return [p for p in map(Profile.from_json, self._load().values()) if p.model_path == model_path
                and (p.fingerprint, p.model_hash, p.engine) != (fingerprint, model_hash, engine)]

    def lookup(self, model_path: str, fingerprint: str, engine: str, sampling: str | None = GREEDY_KEY,
               ) -> ProfileMatch:
        """The profile for this model file, machine and engine build, and whether
        an older one went stale. Hashes the file (reads 16 MiB): call it off the
        GUI thread.

        The profile measured with ``sampling`` when there is one; else the newest
        one measured with another sampling: its setting is still the best guess
        (its ``sampling`` says what its speedup holds for).
        """
        model_hash = model_identity(model_path)
        profile = (self.find(fingerprint, model_hash, engine, sampling) if sampling is not None else None) \
            or self.find(fingerprint, model_hash, engine, None)
        stale = profile is None and bool(self.stale_for(model_path, fingerprint, model_hash, engine))
        return ProfileMatch(profile, stale)


def new_profile(fingerprint: str, model_path: str, engine: str, setting: SpeculativeSettings, speedup: float,
                reason: str, threads: int = 0, threads_draft: int = 0, sampling: str = GREEDY_KEY,
                concurrency: dict[int, ConcurrencyChoice] | None = None, draft_vocab: int | None = None) -> Profile:
    return Profile(fingerprint, model_identity(model_path), engine, model_path, setting, speedup, reason, time.time(),
                   threads, threads_draft, PROFILE_VERSION, sampling, dict(concurrency or {}), draft_vocab)

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
``threads_draft``; 0 = not measured, keep the load settings).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from engine import paths
from engine.speculative.settings import SpeculativeSettings

HASH_SPAN = 8 << 20  # bytes read from each end of the file
PROFILE_VERSION = 2
OUTDATED_TEXT = ("made by an older autotune that tried only fixed MTP depths (not adaptive depth, n-gram drafting "
                 "or thread counts); it still applies — tune again to try the rest")


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

    @property
    def outdated(self) -> bool:
        """Made by an older search: still valid, but chosen among fewer policies."""
        return self.version < PROFILE_VERSION

    @property
    def key(self) -> str:
        return f"{self.fingerprint}:{self.model_hash}:{self.engine}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "setting": self.setting.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Profile:
        """A stored profile; files written before the settings had one type still read."""
        known = {f.name for f in fields(cls)}
        return replace(cls(**{**{k: v for k, v in data.items() if k in known}, "setting": SpeculativeSettings()}),
                       setting=SpeculativeSettings.from_json(data.get("setting") or {}))


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

    def find(self, fingerprint: str, model_hash: str, engine: str) -> Profile | None:
        raw = self._load().get(f"{fingerprint}:{model_hash}:{engine}")
        return Profile.from_json(raw) if raw else None

    def stale_for(self, model_path: str, fingerprint: str, model_hash: str, engine: str) -> list[Profile]:
        """Profiles of this model file made on other hardware, engine or file contents."""
        current = f"{fingerprint}:{model_hash}:{engine}"
        return [Profile.from_json(p) for k, p in self._load().items()
                if p.get("model_path") == model_path and k != current]

    def lookup(self, model_path: str, fingerprint: str, engine: str) -> ProfileMatch:
        """The profile for this model file, machine and engine build, and whether
        an older one went stale. Hashes the file (reads 16 MiB): call it off the
        GUI thread."""
        model_hash = model_identity(model_path)
        profile = self.find(fingerprint, model_hash, engine)
        stale = profile is None and bool(self.stale_for(model_path, fingerprint, model_hash, engine))
        return ProfileMatch(profile, stale)


def new_profile(fingerprint: str, model_path: str, engine: str, setting: SpeculativeSettings, speedup: float,
                reason: str, threads: int = 0, threads_draft: int = 0) -> Profile:
    return Profile(fingerprint, model_identity(model_path), engine, model_path, setting, speedup, reason, time.time(),
                   threads, threads_draft, PROFILE_VERSION)

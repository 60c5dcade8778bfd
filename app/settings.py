"""User settings, persisted as JSON in the config folder (platformdirs).

Writes are atomic (temporary file + rename), so a crash never leaves a
half-written settings file; an unreadable file falls back to defaults and is
kept aside rather than overwritten silently.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine import paths
from engine.hardware import default_threads

FILE_NAME = "settings.json"


@dataclass
class Settings:
    model_path: str | None = None  # None: the embedded default model
    sidecar_path: str | None = None
    n_threads: int = field(default_factory=default_threads)
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    theme: str = "system"  # system | light | dark
    max_tokens: int = 512
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    speculative: str = "auto"  # auto (the autotune profile, else MTP n_max 3) | off | mtp
    n_max: int = 3
    p_min: float = 0.0
    highlight_drafts: bool = False
    system_prompt: str = ""

    @classmethod
    def path(cls) -> Path:
        return paths.config_dir() / FILE_NAME

    @classmethod
    def load(cls) -> Settings:
        path = cls.path()
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError):
            path.replace(path.with_suffix(".unreadable.json"))
            return cls()
        known = {f.name for f in dataclasses.fields(cls)}
        defaults = cls()
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in known and (value is None or isinstance(value, type(getattr(defaults, key)))
                                 or getattr(defaults, key) is None):
                values[key] = value
        return cls(**values)

    def save(self) -> None:
        path = self.path()
        tmp = path.with_suffix(".json.partial")
        tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2))
        os.replace(tmp, path)

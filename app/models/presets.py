"""What the app remembers per model file: its preset and when it was last loaded.

A preset is what a switcher from LM Studio expects a model to bring with it:
sampling, context, threads, a system prompt for new chats and a chat template
that replaces the model's own. Each part is optional (``None``: the
preferences' own), and it applies when that model loads (``ModelController``):
context and threads go into the load, the rest goes over the preferences for
the chats (a chat's own settings still go over it).

Kept beside the library's folders, in ``models.json`` in the config folder,
keyed by the model's absolute path. Writes are atomic (temporary file +
rename); a file that cannot be read starts empty, and a field that cannot be
used is dropped alone (a hand-edited file costs that field, not the preset).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.reply_values import read_sampling
from app.settings_check import acceptable
from app.text_check import is_text
from engine import paths
from engine.sampling import SamplingParams

FILE_NAME = "models.json"


@dataclass(frozen=True)
class ModelPreset:
    """How one model loads and replies; a ``None`` part leaves the preferences' value."""

    sampling: SamplingParams | None = None
    n_ctx: int | None = None
    n_threads: int | None = None
    system_prompt: str | None = None
    chat_template: str | None = None  # a Jinja template over the model's own

    @property
    def empty(self) -> bool:
        return self == ModelPreset()

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, data: Any) -> ModelPreset:
        """A preset from its JSON; a part of the wrong type or out of range is left out."""
        if not isinstance(data, dict):
            return cls()
        values: dict[str, Any] = {}
        if isinstance(data.get("sampling"), dict):
            sampling, unusable = read_sampling({"sampling": data["sampling"]}, SamplingParams())
            if not unusable:
                values["sampling"] = sampling
        for key in ("n_ctx", "n_threads"):
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and acceptable(key, value, 0):
                values[key] = value
        for key in ("system_prompt", "chat_template"):
            value = data.get(key)
            if isinstance(value, str) and is_text(value):
                values[key] = value
        return cls(**values)


@dataclass(frozen=True)
class ModelRecord:
    preset: ModelPreset = ModelPreset()
    last_used: float | None = None  # seconds since the epoch


def key(model_path: str | Path) -> str:
    """The file's absolute path as the record's key (no filesystem call: the GUI thread asks)."""
    return os.path.abspath(os.path.expanduser(str(model_path)))


class ModelRecords:
    """Every model's record, read once and written through on each change."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or paths.config_dir() / FILE_NAME
        self._records: dict[str, ModelRecord] = self._read()

    def get(self, model_path: str | Path | None) -> ModelRecord:
        """``model_path``'s record (None, the built-in model, has an empty one)."""
        return self._records.get(key(model_path), ModelRecord()) if model_path else ModelRecord()

    def preset(self, model_path: str | Path | None) -> ModelPreset:
        return self.get(model_path).preset

    def last_used(self) -> dict[str, float]:
        """Every model's last load, by key (a copy the background scan may read)."""
        return {k: r.last_used for k, r in self._records.items() if r.last_used is not None}

    def set_preset(self, model_path: str | Path, preset: ModelPreset) -> str:
        """Keep ``preset`` for the model; why it could not be written ("" when it was; kept in memory anyway)."""
        k = key(model_path)
        self._records[k] = dataclasses.replace(self._records.get(k, ModelRecord()), preset=preset)
        return self._write()

    def mark_used(self, model_path: str | Path, when: float | None = None) -> str:
        k = key(model_path)
        self._records[k] = dataclasses.replace(self._records.get(k, ModelRecord()),
                                               last_used=time.time() if when is None else when)
        return self._write()

    def _read(self) -> dict[str, ModelRecord]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError):
            return {}
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            return {}
        out = {}
        for k, entry in models.items():
            if not isinstance(k, str) or not isinstance(entry, dict):
                continue
            used = entry.get("last_used")
            out[k] = ModelRecord(ModelPreset.from_json(entry.get("preset")),
                                 float(used) if isinstance(used, int | float) and not isinstance(used, bool)
                                 else None)
        return out

    def _write(self) -> str:
        data = {"models": {k: {"preset": r.preset.to_json(), **({"last_used": r.last_used}
                                                                if r.last_used is not None else {})}
                           for k, r in self._records.items()}}
        tmp = self.path.with_suffix(".json.partial")
        try:
            tmp.write_text(json.dumps(data, indent=2), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            return f"{exc.strerror or exc} ({self.path})"
        return ""

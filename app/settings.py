"""User settings, persisted as JSON in the config folder (platformdirs).

Writes are atomic (temporary file + rename), so a crash never leaves a
half-written settings file. A write the disk refuses (full, read-only) does
not raise: :meth:`Settings.try_save` says why, the settings stay in use in
memory, and closing the window tries again and tells the user. An unreadable file falls back to defaults and is
kept aside under a name of its own (``settings.unreadable-<time>.json``); a
field of the wrong type or out of range takes its default alone. Either way
:meth:`Settings.read` returns a notice for the user.

Files from older versions keep loading: a field they lack takes its default;
sampling written flat (before it was one nested :class:`SamplingParams`,
seed -1 for random) reads as the same values (:mod:`app.reply_values`); and
a file written before sampling presets existed whose sampling values are the
old defaults (greedy, which made small models loop) moves to the default
preset, since those values were never a choice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.reply_values import REPLY_FIELDS, ReplyValues, read_sampling
from app.set_aside import set_aside
from app.settings_check import acceptable, same_type
from engine import paths
from engine.hardware import default_threads
from engine.sampling import DEFAULT_PRESET, PRESETS, SamplingParams

# The sampling values every settings file had before presets existed: untouched, not chosen.
_OLD_DEFAULTS = {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05}

FILE_NAME = "settings.json"


@dataclass
class Settings:
    model_path: str | None = None  # None: the embedded default model
    sidecar_path: str | None = None
    mmproj_path: str | None = None  # the vision projector loaded with the model (None: none)
    recent_models: list[str] = field(default_factory=list)  # loaded successfully, newest first (the picker)
    n_threads: int = field(default_factory=default_threads)
    n_threads_draft: int = 0  # threads of the MTP draft context; 0: n_threads (autotune may choose fewer)
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    # per model (its path; "" for the built-in one): the MTP head drafts only among token ids below this
    # (engine LoadOptions.draft_vocab); a model not named drafts among all of them. Per model because the cut
    # that pays on a 151,936-token vocabulary (autotune measures it) is wrong for a 32,000-token one
    draft_vocabs: dict[str, int] = field(default_factory=dict)
    # host memory for earlier conversations' states (engine LoadOptions.state_cache_mib): going back to a chat the
    # engine let go of reads it from there instead of prefilling it again; 0: none kept
    state_cache_mib: int = 2048
    # a sliding-window model (Gemma 3, Step 3.5) keeps every cell of its windowed layers (engine
    # LoadOptions.swa_full): more memory, no copy of the window at each prompt's end
    swa_full: bool = False
    rpc_servers: str = ""  # ggml RPC servers, "host:port,…": the trunk is split across them (docs/multi-machine.md)
    theme: str = "system"  # system | light | dark
    max_tokens: int = 512
    # a preset's values (engine.sampling.PRESETS) or the user's own; seed RANDOM_SEED: a new one each reply,
    # else the same seed and settings give the same reply
    sampling: SamplingParams = PRESETS[DEFAULT_PRESET]
    speculative: str = "auto"  # auto (the autotune profile, else MTP n_max 3) | off | mtp | ngram | mtp+ngram
    n_max: int = 3
    p_min: float = 0.0
    # sampled replies: drafts sampled and kept by rejection sampling (faster at high temperature, not seed-identical)
    probabilistic_drafts: bool = False
    highlight_drafts: bool = False
    system_prompt: str = ""
    window_state: dict[str, str] = field(default_factory=dict)  # geometry, splitter (app/window_extras.py)
    # the Local server panel (app/server_panel.py); its API key lives in the OS keyring, never here
    server_host: str = "127.0.0.1"
    server_port: int = 8181
    server_require_key: bool = False
    # replies decoded at once, the chat's and the local server's together: the model is loaded with this
    # many sequences of n_ctx tokens each (engine/generation/parallel.py); 1: one at a time; 0 (Auto): as many
    # as fit in memory beside the model, up to 4 (engine/store/parallel_fit.py), so the chat and the server
    # do not wait for each other
    parallel: int = 0
    # with several replies at once, one pool of cells for all of them (LoadOptions.kv_unified): a shared prompt
    # is read once; False: a pool per reply, faster with many long conversations at once (docs/parallel.md)
    kv_unified: bool = True

    @classmethod
    def path(cls) -> Path:
        return paths.config_dir() / FILE_NAME

    @classmethod
    def load(cls) -> Settings:
        return cls.read()[0]

    @classmethod
    def read(cls) -> tuple[Settings, list[str]]:
        """The saved settings, and what the user should be told about them.

        A file that is not a JSON object (not JSON, a list, nested too deep to
        parse) is set aside as ``settings.unreadable-<time>.json`` and the
        defaults are used; a field of the wrong type or out of range
        (:mod:`app.settings_check`) takes its default and the others stay.
        """
        path = cls.path()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(), []
        except (OSError, ValueError, RecursionError, MemoryError) as exc:
            return cls(), [_set_aside(path, f"it is not valid JSON ({type(exc).__name__})")]
        if not isinstance(data, dict):
            return cls(), [_set_aside(path, f"it holds a JSON {type(data).__name__}, not an object")]
        known = {f.name for f in dataclasses.fields(cls)}
        defaults = cls()
        values: dict[str, Any] = {}
        reset: list[str] = []
        data = _one_draft_vocab_moved(data)
        for key, value in data.items():
            if key not in known or key == "sampling":
                continue  # a field a later version added, or one since removed; the sampling below
            default = getattr(defaults, key)
            if not (same_type(value, default) and acceptable(key, value, default)):
                reset.append(key)
                continue
            if isinstance(default, float):
                value = float(value)  # JSON written by hand: 1 for 1.0
            values[key] = value
        values["sampling"], unusable = read_sampling(_unchosen_defaults_dropped(data), defaults.sampling)
        reset += unusable
        notices = []
        if reset:
            notices.append(f"Some settings in {path} could not be used and were reset to their defaults: "
                           f"{', '.join(reset)}. Check them in Preferences.")
        return cls(**values), notices

    def draft_vocab_for(self, model_path: str | None) -> int:
        """The token ids the MTP head of ``model_path`` (None: the built-in model) drafts among; 0: all."""
        return self.draft_vocabs.get(model_path or "", 0)

    def set_draft_vocab(self, model_path: str | None, value: int) -> None:
        """Remember ``value`` for ``model_path`` alone (0: the whole vocabulary, the default)."""
        if value:
            self.draft_vocabs[model_path or ""] = value
        else:
            self.draft_vocabs.pop(model_path or "", None)

    def reply_values(self) -> ReplyValues:
        """The preferences' sampling, length and speculation: what a chat's own settings go over."""
        return ReplyValues(**{name: getattr(self, name) for name in REPLY_FIELDS})

    def set_reply_values(self, values: ReplyValues) -> None:
        for name in REPLY_FIELDS:
            setattr(self, name, getattr(values, name))

    def save(self) -> None:
        """Write the settings file.

        Raises:
            OSError: it could not be written (the file as it was is kept).
        """
        path = self.path()
        tmp = path.with_suffix(".json.partial")
        try:
            tmp.write_text(json.dumps(dataclasses.asdict(self), indent=2))
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a partial file would take what room is left
            raise

    def try_save(self) -> str:
        """Write the settings file; why it could not be written ("" when it was)."""
        try:
            self.save()
        except OSError as exc:
            return f"{exc.strerror or exc} ({self.path()})"
        return ""


def _unchosen_defaults_dropped(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the sampling values a file from before presets holds untouched
    (flat, no preset name, the old defaults), so the default preset replaces them."""
    if "sampling" in data or "sampling_preset" in data:
        return data
    if not all(data.get(k, v) == v for k, v in _OLD_DEFAULTS.items()):
        return data
    return {k: v for k, v in data.items() if k not in _OLD_DEFAULTS}


def _set_aside(path: Path, why: str) -> str:
    """Keep the unreadable file under a name of its own; the notice that says where."""
    try:
        kept = set_aside(path)
    except OSError as exc:
        return (f"Your settings file {path} could not be read ({why}) nor moved aside ({exc.strerror}); "
                "the defaults are used and will be saved over it on quit.")
    return f"Your settings file could not be read ({why}); the defaults are used. It was kept as {kept}."


def _one_draft_vocab_moved(data: dict[str, Any]) -> dict[str, Any]:
    """A file from before the draft vocabulary was kept per model had one ``draft_vocab`` for every model:
    it goes to the model the file was saved with (the one it was chosen or measured on)."""
    if "draft_vocab" not in data or "draft_vocabs" in data:
        return data
    data = dict(data)
    value = data.pop("draft_vocab")
    model = data.get("model_path")
    counted = isinstance(value, int) and not isinstance(value, bool) and value > 0
    if counted and (model is None or isinstance(model, str)):
        data["draft_vocabs"] = {model or "": value}
    return data

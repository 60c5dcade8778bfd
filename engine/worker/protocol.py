"""The worker protocol: one JSON object per line, versioned, every field checked.

Requests (app -> worker) and events (worker -> app) are frozen dataclasses.
``decode_request`` refuses anything malformed with a :class:`ProtocolError`
naming the field; nothing is guessed at.

Version 1:
  requests  load, generate, cancel, unload, shutdown
  events    ready (the handshake), loaded, token, stats, done, error,
            unloaded, bye
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ProtocolError

PROTOCOL_VERSION = 1
HANDSHAKE_TIMEOUT_S = 60.0  # the first import of llama_cpp can be slow on a cold disk


# -- requests --------------------------------------------------------------
@dataclass(frozen=True)
class LoadRequest:
    id: str
    path: str | None = None  # None: the embedded default model
    n_ctx: int = 4096
    n_gpu_layers: int = 0
    n_threads: int = 1
    mtp: bool = True
    sidecar: str | None = None
    type: str = "load"


@dataclass(frozen=True)
class SpeculativeSettings:
    mode: str = "none"  # none | mtp
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0


@dataclass(frozen=True)
class GenerateRequestMsg:
    id: str
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0xFFFFFFFF
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    speculative: SpeculativeSettings = SpeculativeSettings()
    type: str = "generate"


@dataclass(frozen=True)
class CancelRequest:
    id: str
    target: str | None = None  # the generate request to cancel; None: whatever runs
    type: str = "cancel"


@dataclass(frozen=True)
class UnloadRequest:
    id: str
    type: str = "unload"


@dataclass(frozen=True)
class ShutdownRequest:
    id: str
    type: str = "shutdown"


REQUESTS: dict[str, type] = {
    "load": LoadRequest,
    "generate": GenerateRequestMsg,
    "cancel": CancelRequest,
    "unload": UnloadRequest,
    "shutdown": ShutdownRequest,
}

FINISH_REASONS = ("stop", "length", "cancelled", "error")


# -- validation --------------------------------------------------------------
def _check(value: Any, annotation: Any, where: str) -> Any:
    """Return ``value`` converted to ``annotation``, or raise ProtocolError."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check(value, arg, where)
            except ProtocolError as exc:
                errors.append(str(exc))
        raise ProtocolError(errors[0] if errors else f"{where}: unexpected null")
    if origin is list:
        (item,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_t, val_t = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        return {_check(k, key_t, where): _check(v, val_t, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        return _build(annotation, value, where)
    if annotation is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected true/false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {value!r}")
        return value
    raise ProtocolError(f"{where}: unsupported type {annotation!r}")  # pragma: no cover


def _build(cls: Any, data: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _check(data[f.name], hints[f.name], f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where}: missing field '{f.name}'")
    return cls(**kwargs)


def decode_request(line: str | bytes) -> Any:
    """Parse one request line.

    Raises:
        ProtocolError: not JSON, not an object, unknown type, or a bad field.
    """
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("a request must be a JSON object")
    kind = data.get("type")
    cls = REQUESTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown request type {kind!r}; expected one of {sorted(REQUESTS)}")
    return _build(cls, data, str(kind))


def encode(message: Any) -> str:
    """One line of JSON for a request dataclass (or a plain event dict)."""
    data = dataclasses.asdict(message) if dataclasses.is_dataclass(message) and not isinstance(message, type) \
        else message
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def request_id(data: Any) -> str | None:
    """The id of a request that failed to decode, if one can be read."""
    try:
        value = json.loads(data).get("id")
    except Exception:
        return None
    return value if isinstance(value, str) else None


# -- events (worker -> app) are plain dicts built here, so both ends agree ---
def event(event_type: str, request: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"type": event_type, "id": request, **fields}


def decode_event(line: str | bytes) -> dict[str, Any]:
    """Parse an event line from the worker.

    Raises:
        ProtocolError: not a JSON object with a string ``type``.
    """
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"the worker wrote a line that is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ProtocolError("the worker wrote something that is not an event object")
    return data

"""Field-by-field checking of protocol messages: JSON values against a
dataclass's annotations. Both requests and events are built with it, so
each end refuses what the other should never have sent, naming the field."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from engine.errors import ProtocolError

_SCALARS = (str, int, bool, float)


def check(value: Any, annotation: Any, where: str) -> Any:
    """Return ``value`` converted to ``annotation``, or raise ProtocolError.

    ``Any`` takes any JSON value as it is: a field so typed (a tool's JSON
    schema, a chat message with tool calls) is checked by its own owner."""
    if annotation is Any:
        return value
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
                return check(value, arg, where)
            except ProtocolError as exc:
                errors.append(str(exc))
        raise ProtocolError(errors[0] if errors else f"{where}: unexpected null")
    if origin is list:
        (item,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return [check(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:  # tuple[X, ...]: a JSON list
        item, _ = typing.get_args(annotation)
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
        return tuple(check(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        key_t, val_t = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        return {check(k, key_t, where): check(v, val_t, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(annotation):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected an object, got {type(value).__name__}")
        return build(annotation, value, where)
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


def _exact_types(annotation: Any) -> frozenset[type]:
    """Types a value may have to be taken as it is: ``str`` for ``str``,
    ``str`` and ``None`` for ``str | None``; others go through :func:`check`."""
    if annotation in _SCALARS:
        return frozenset({annotation})
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if all(a in _SCALARS or a is type(None) for a in args):
            return frozenset(args)
    return frozenset()


@functools.cache
def _shape(cls: Any) -> tuple[frozenset[str], tuple[tuple[str, Any, frozenset[type], bool], ...]]:
    """Type hints and fields of a message class, worked out once: token events
    arrive thousands of times a second."""
    hints = typing.get_type_hints(cls)
    fields = tuple(
        (f.name, hints[f.name], _exact_types(hints[f.name]),
         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    )
    return frozenset(name for name, *_ in fields), fields


def build(cls: Any, data: dict[str, Any], where: str) -> Any:
    """An instance of dataclass ``cls`` from a JSON object, every field checked.

    Raises:
        ProtocolError: an unknown or missing field, a wrong type, or a value
            the class itself refuses (its ``ValueError``), naming the field.
    """
    names, fields = _shape(cls)
    if not names.issuperset(data):
        raise ProtocolError(f"{where}: unknown field(s) {sorted(set(data) - names)}")
    kwargs = {}
    for name, annotation, exact, required in fields:
        if name in data:
            value = data[name]
            kwargs[name] = value if type(value) in exact else check(value, annotation, f"{where}.{name}")
        elif required:
            raise ProtocolError(f"{where}: missing field '{name}'")
    try:
        return cls(**kwargs)
    except ValueError as exc:  # a type that checks its own values (SpeculativeSettings)
        raise ProtocolError(f"{where}: {exc}") from None

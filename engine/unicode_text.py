"""Is a decoded JSON value text that can be encoded? JSON may spell a lone
surrogate (``"\\ud800"``), and Python decodes it into a ``str`` that no UTF-8
encoder, tokenizer or log line accepts. Each edge (the HTTP server, the
worker protocol) asks here once, so what passes it is Unicode everywhere after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BadText:
    """Where the first lone surrogate is.

    ``path`` is printable (``messages[0].content``; a bad name is shown
    escaped), ``top`` its first component (the parameter to name), ``name``
    whether the bad text is an object key rather than a value.
    """

    path: str
    top: str
    offset: int
    char: str
    name: bool

    def describe(self) -> str:
        what = f"The name '{self.path}'" if self.name else f"'{self.path}'"
        return (f"{what} holds a lone surrogate ({self.char} at offset {self.offset}), which is not Unicode "
                "text; send valid UTF-8")


def printable(text: str) -> str:
    """``text`` with each lone surrogate written as its escape (``\\ud800``): safe to encode and show."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _bad_offset(text: str) -> int | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


Trail = tuple["Trail", "str | int"] | None  # the way to an item, innermost last: (parent's trail, key or index)


def _path(trail: Trail, where: str) -> str:
    parts: list[str] = []
    while trail is not None:
        trail, step = trail
        parts.append(f"[{step}]" if isinstance(step, int) else f".{printable(step)}")
    text = where + "".join(reversed(parts))
    return text[1:] if text.startswith(".") else text


def first_bad_text(value: Any, where: str = "") -> BadText | None:
    """The first lone surrogate in a decoded JSON value (an object's keys before its values), or None.

    Iterative, not recursive, and each item's path is worked out only for the one reported: a body
    nested as deep as the JSON decoder allows, or millions of items wide, costs one pass.
    """
    stack: list[tuple[Any, Trail]] = [(value, None)]
    while stack:
        item, trail = stack.pop()
        if isinstance(item, str):
            offset = _bad_offset(item)
            if offset is not None:
                return _found(trail, where, item, offset, name=False)
        elif isinstance(item, dict):
            children: list[tuple[Any, Trail]] = []
            for key, sub in item.items():
                if isinstance(key, str) and (offset := _bad_offset(key)) is not None:
                    return _found((trail, key), where, key, offset, name=True)
                children.append((sub, (trail, key)))
            stack.extend(reversed(children))
        elif isinstance(item, list):
            stack.extend(reversed([(sub, (trail, i)) for i, sub in enumerate(item)]))
    return None


def _found(trail: Trail, where: str, text: str, offset: int, name: bool) -> BadText:
    top = trail
    while top is not None and top[0] is not None:
        top = top[0]
    first = where or ("" if top is None else _path(top, ""))
    return BadText(_path(trail, where), first, offset, printable(text[offset]), name)

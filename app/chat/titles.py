"""A new chat's title from its first message, as plain words: the message is often Markdown
("## Fix the **parser**", "- [ ] `ls` fails"), and a title that keeps the marks reads as noise in the
chat list. The first line with words in it, its marks taken off, cut at :data:`MAX_CHARS`."""

from __future__ import annotations

import re

MAX_CHARS = 48

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINE_START = re.compile(r"^\s*(#{1,6}\s+|>\s*|[-*+]\s+(\[[ xX]\]\s+)?|\d+[.)]\s+)+")
_IMAGE_OR_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_TAG = re.compile(r"</?[A-Za-z][^>]*>")
_EMPHASIS = re.compile(r"(\*\*|__|~~|\*|`)")
_UNDERSCORE_EMPHASIS = re.compile(r"(?<![A-Za-z0-9])_([^_]+)_(?![A-Za-z0-9])")


def plain(line: str) -> str:
    """``line`` without Markdown's marks: headings, quotes, list bullets, emphasis, code ticks, links."""
    line = _LINE_START.sub("", line)
    line = _IMAGE_OR_LINK.sub(r"\1", line)
    line = _TAG.sub("", line)
    line = _EMPHASIS.sub("", line)
    line = _UNDERSCORE_EMPHASIS.sub(r"\1", line)
    return " ".join(line.split())


def title_from(text: str) -> str:
    """The title for a chat whose first message is ``text``."""
    for line in text.splitlines():
        if _FENCE.match(line):
            continue
        words = plain(line)
        if words:
            return words[:MAX_CHARS] + ("…" if len(words) > MAX_CHARS else "")
    return "New chat"

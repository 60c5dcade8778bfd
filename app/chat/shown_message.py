"""One message as the transcript shows it: its text and status, the statistics under a reply, which
of its versions it is, its images, and what wrote it. The controller builds these from the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.chat import written_by
from app.chat.attachments import Attachment
from app.chat.rows import Message
from engine.speculative.stats import StatsSnapshot
from engine.worker.events import stats_from_json


@dataclass
class ShownMessage:
    role: str
    content: str
    status: str = "complete"
    stats: StatsSnapshot | None = None
    segments: list[tuple[str, bool]] = field(default_factory=list)  # (text, from accepted drafts)
    id: int | None = None  # the stored message
    version: int = 0  # which of the message's versions this is (0-based): regenerations, or an edit's branches
    version_count: int = 1
    unfinished: bool = False  # ended before its end (stopped, interrupted, the length limit): Continue goes on
    images: tuple[Attachment, ...] = ()  # attached images, shown as thumbnails above the text
    written_by: str = ""  # a reply's model, sampling and speculative settings, in words (app/chat/written_by.py)
    continued: tuple[int, int] | None = None  # after Continue: the whole reply's tokens, and its parts


def shown(m: Message, last: bool, waiting: dict[str, Any], images: tuple[Attachment, ...], max_tokens: int,
          ) -> ShownMessage:
    """A stored message as the transcript shows it; ``waiting``: what the disk has not taken yet of a reply
    (it shows as it is in memory); ``last``: the conversation's last message (it may be continued)."""
    status = waiting.get("status", m.status)
    stored = waiting.get("stats", m.stats)
    raw, author = written_by.split(stored)
    stats = stats_from_json(raw)
    content = waiting.get("content", m.content)
    ended_early = last and unfinished(m.role, status, stats, max_tokens)
    return ShownMessage(m.role, content, status, stats, id=m.id, version=m.version, version_count=m.version_count,
                        unfinished=ended_early, images=images, written_by=written_by.author_text(author, stats),
                        segments=written_by.segments_of(content, stored) if m.role == "assistant" else [],
                        continued=written_by.continued_of(stored))


def unfinished(role: str, status: str, stats: StatsSnapshot | None, max_tokens: int) -> bool:
    """Whether a reply ended before its end: stopped, interrupted, or at the length limit
    (as many tokens as a reply may have: a reply that ends by itself stops short of it)."""
    if role != "assistant":
        return False
    at_limit = stats is not None and stats.generated_tokens >= max_tokens
    return status in ("cancelled", "interrupted") or (status == "complete" and at_limit)

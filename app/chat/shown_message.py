"""One message as the transcript shows it: its text and status, the statistics under a reply, which
of its versions it is, its images, and what wrote it. The controller builds these from the store."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.chat.attachments import Attachment
from engine.speculative.stats import StatsSnapshot


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

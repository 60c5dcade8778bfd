"""The Responses API's ``store``: recent responses kept in memory, so a client may
continue a conversation with ``previous_response_id`` instead of sending it again.

OpenAI stores responses by default (``store`` true); so does this server, but
only the most recent :data:`MAX_RESPONSES` and only while it runs: a restart,
or a response pushed out by newer ones, answers ``previous_response_id`` with
a 404 that says to send the whole conversation. What is kept is the
conversation as the engine saw it (the input messages, the instructions left
out as OpenAI leaves them out of a continuation) and the reply as an
assistant message with its tool calls, with the sources of the images whose
markers its messages hold (data URLs, or local paths), so a continuation
sends them again. An image kept by several responses of one conversation is
the same string, kept once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from engine.server.reply import Reply

MAX_RESPONSES = 256


class ResponseStore:
    def __init__(self, limit: int = MAX_RESPONSES) -> None:
        self.limit = limit
        self._kept: OrderedDict[str, tuple[tuple[dict[str, Any], ...], tuple[str, ...]]] = OrderedDict()
        self._lock = threading.Lock()

    def conversation(self, response_id: str) -> tuple[list[dict[str, Any]], list[str]] | None:
        """The messages a stored response ended, its reply included, and the sources of their images
        (one per image marker, in order); None when it is not kept."""
        with self._lock:
            kept = self._kept.get(response_id)
            if kept is not None:
                self._kept.move_to_end(response_id)
        return None if kept is None else ([dict(m) for m in kept[0]], list(kept[1]))

    def keep(self, response_id: str, messages: list[dict[str, Any]], reply: Reply,
             images: list[str] | tuple[str, ...] = ()) -> None:
        answer: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            answer["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                                                                                   "arguments": c.arguments}}
                                    for c in reply.tool_calls]
        with self._lock:
            self._kept[response_id] = ((*messages, answer), tuple(images))
            while len(self._kept) > self.limit:
                self._kept.popitem(last=False)

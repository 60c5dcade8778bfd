"""Fitting a conversation into the model's context: what one reply is asked
for, and the words that say what it had to leave out.

A conversation may outgrow the model's context. The app cannot count tokens
before it asks (only the worker has the tokenizer), so it lets the worker
decide: a prompt that does not fit is refused before anything is decoded (a
``context`` error, then ``done``), and the chat asks again without the oldest
turn (:meth:`Turn.drop_oldest_turn`), until it fits or only the new message
is left.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.chat.store import Message

CONTEXT_SETTING = "Settings → Preferences → Context size"


@dataclass
class Turn:
    """What one reply is asked for: the system prompt and the conversation,
    of which the oldest ``dropped`` messages are left out because they did
    not fit the context. With ``continuing``, the newest message is the
    reply itself, unfinished: the engine goes on from its last word."""

    system: str
    messages: list[Message]  # the newest (the message being answered, or the reply continued) last
    dropped: int = 0
    refused: str = ""  # the engine's words when the last attempt did not fit
    continuing: bool = False

    def request_messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [{"role": m.role, "content": m.content} for m in self.messages[self.dropped:]]

    def start_at(self, first_id: int) -> None:
        """Leave out what an earlier reply had to leave out: messages older than ``first_id``."""
        self.dropped = next((i for i, m in enumerate(self.messages) if m.id >= first_id), 0)
        self._to_user_message()

    def drop_oldest_turn(self) -> bool:
        """Leave out the oldest kept turn; False when only the newest message is left.

        The cut lands on a user message: chat templates often refuse a
        conversation that starts with the assistant."""
        if self.dropped >= len(self.messages) - 1:
            return False
        self.dropped += 1
        self._to_user_message()
        return True

    @property
    def first_kept_id(self) -> int:
        return self.messages[self.dropped].id

    def _to_user_message(self) -> None:
        last = len(self.messages) - 1
        while self.dropped < last and self.messages[self.dropped].role != "user":
            self.dropped += 1


def context_words(context_size: int) -> str:
    return f"the {context_size:,}-token context" if context_size else "the model's context"


def left_out_notice(turn: Turn | None, context_size: int) -> str:
    """Tells the user, plainly, what this reply did not see ("" when it saw everything)."""
    dropped = turn.dropped if turn else 0
    if not dropped:
        return ""
    what = "The oldest message no longer fits" if dropped == 1 else f"The oldest {dropped} messages no longer fit"
    return f"{what} {context_words(context_size)} and {'was' if dropped == 1 else 'were'} left out of this reply."


def too_long_notice(turn: Turn | None, context_size: int) -> str:
    """Why a message got no reply: it does not fit even alone, and what to do."""
    engine_said = (turn.refused if turn else "").split(". ")[0].rstrip(".")
    engine_said = engine_said[:1].lower() + engine_said[1:]
    return (f"This message does not fit {context_words(context_size)} even without the earlier conversation"
            + (f" ({engine_said})" if engine_said else "")
            + f". Raise the context size ({CONTEXT_SETTING}) or shorten the message"
            + (" or the chat's system prompt." if turn and turn.system else "."))

"""A reply's reasoning apart from its answer: the text of a ``<think>`` block.

Thinking models (Qwen3 / 3.5, QwQ, DeepSeek R1, GLM 4.5+, MiniMax M2) write
their reasoning between ``<think>`` and ``</think>`` before the answer; some
templates open the block in the prompt itself (Qwen3.5's generation prompt
ends with ``<think>``), so the reply starts inside it. APIs carry the two
apart (OpenAI-style ``reasoning_content`` as llama-server sends it,
Anthropic's thinking blocks, the Responses API's reasoning items, Ollama's
``thinking``), and a tool-call parser must not read a call the model only
thought about. The split is made on the visible text as it streams: a tag
cut across two tokens is held back until it is whole.
"""

from __future__ import annotations

from engine.generation.chat_template import THINK_CLOSE, THINK_OPEN


def _partial_tail(text: str, tag: str) -> int:
    """How many trailing characters of ``text`` could begin ``tag``."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


class ReasoningSplit:
    """Text in, ``(text, is_reasoning)`` pieces out. One block per reply: it may open only
    before any answer text (whitespace aside), and once closed the rest is answer."""

    def __init__(self, inside: bool) -> None:
        self.state = "reasoning" if inside else "start"
        self.held = ""
        self.after_close = False  # the answer's leading blank lines after </think> are dropped

    def feed(self, text: str) -> list[tuple[str, bool]]:
        buf, out = self.held + text, []
        self.held = ""
        while buf:
            if self.state == "start":
                stripped = buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self.state, buf = "reasoning", stripped[len(THINK_OPEN):].lstrip("\n")
                    continue
                if stripped and not THINK_OPEN.startswith(stripped):
                    self.state = "answer"
                    continue
                self.held = buf  # blank, or the beginning of the tag: wait for more
                return out
            if self.state == "reasoning":
                at = buf.find(THINK_CLOSE)
                if at < 0:
                    keep = _partial_tail(buf, THINK_CLOSE)
                    if len(buf) > keep:
                        out.append((buf[:len(buf) - keep], True))
                    self.held = buf[len(buf) - keep:]
                    return out
                if at:
                    out.append((buf[:at], True))
                self.state, self.after_close, buf = "answer", True, buf[at + len(THINK_CLOSE):]
                continue
            if self.after_close:
                buf = buf.lstrip("\n")
                if not buf:
                    return out
                self.after_close = False
            out.append((buf, False))
            return out
        return out

    def flush(self) -> list[tuple[str, bool]]:
        """What is held at the end of the reply, as what it was taken for."""
        held, self.held = self.held, ""
        if not held:
            return []
        return [(held, self.state == "reasoning")]

"""One generation's answer in terms no API owns: the text, the tool calls the
model made, why it ended, and the token counts.

Every API the server speaks (OpenAI chat and completions, the Responses API,
Anthropic Messages, Ollama) builds its own response body from a
:class:`Reply`, so a figure is computed once and the four answers cannot
disagree about it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from engine.generation.tool_calls import ToolCall, call_id  # noqa: F401  (re-exported: part of a Reply)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability under the target, and the most likely alternatives."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[tuple[str, float, list[int]]] = field(default_factory=list)  # (token, logprob, bytes)


@dataclass(frozen=True)
class Reply:
    """What one generation produced, for any API.

    Attributes:
        model: the model id the response names.
        content: the visible text, tool-call markup removed.
        tool_calls: the calls the model made, in order.
        finish: stop | length | cancelled | tool_calls.
        prompt_tokens / completion_tokens: OpenAI's usage figures.
        cached_tokens: prompt tokens the engine already held (prefix reuse).
        logprobs: per generated token, when asked for.
        reasoning: text of a thinking block the template family marks, when the model wrote one.
        stop_sequence: the request's stop string that ended the reply (Anthropic names it).
    """

    model: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    reasoning: str = ""
    stop_sequence: str | None = None  # the stop string that ended the reply, when one did
    extras: dict[str, Any] = field(default_factory=dict)  # timings and the speculation report


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the object Anthropic and Ollama send (``{}`` when not a JSON object)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

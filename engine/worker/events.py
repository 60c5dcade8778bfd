"""Worker events (worker -> app): frozen dataclasses, decoded and checked
field by field like the requests, so a client reads attributes, never keys.

Every request ends with exactly one *final* event: ``loaded``, ``done``, ``tokens``,
``ack`` (a cancel), ``unloaded``, ``bye``, or an ``error`` with ``final`` set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.errors import ProtocolError
from engine.speculative.stats import StatsSnapshot, settings_of_stored_mode
from engine.worker.fields import build


@dataclass(frozen=True)
class EngineBuild:
    """Which llama-cpp-python build the worker runs (``engine.runtime.native.build_info``)."""

    llama_cpp_python: str
    backend: str
    patch_hash: str | None = None
    patches: list[str] | None = None  # the patch series' file names (packaging/patches/), in order
    cmake_args: list[str] | None = None
    cache_key: str | None = None
    lib_path: str | None = None  # LLAMA_CPP_LIB_PATH: a libllama other than the installed wheel's

    @property
    def key(self) -> str:
        """What autotune profiles are keyed by: the build's cache key, else its version."""
        return self.cache_key or self.llama_cpp_python


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model as the worker describes it (``Session.describe``)."""

    path: str
    architecture: str
    description: str = ""
    n_params: int = 0
    size_bytes: int = 0
    n_vocab: int = 0
    n_embd: int = 0
    n_layer: int = 0
    n_layer_nextn: int = 0
    n_ctx_train: int = 0
    hybrid: bool = False
    n_ctx: int = 0
    n_threads: int = 0
    n_threads_draft: int = 0  # threads of the MTP draft context
    draft_vocab: int = 0  # token ids the MTP head drafts among (LoadOptions.draft_vocab; n_vocab: all)
    n_seq: int = 1  # sequences loaded: replies decoded at once
    parallel_reason: str = ""  # why that many, where the load chose them (LoadOptions.parallel 0)
    kv_unified: bool = False  # those sequences share one pool of cells (False: a pool each, or one sequence)
    has_chat_template: bool = False
    mtp: str = "off"  # off | single | chained
    mtp_heads: int = 0
    max_draft: int = 0  # the deepest n_max this model drafts (engine.speculative.settings.deepest_draft)
    mtp_unavailable_reason: str | None = None
    rollback: str = "none"
    n_rs_seq: int = 0
    sidecar: str | None = None
    is_default_model: bool = False
    placement: list[str] | None = None  # with RPC servers: which device holds which blocks
    # the tool-call syntax its chat template uses (engine/generation/tool_calls.py), None: no tools
    tool_syntax: str | None = None
    mmproj: str | None = None  # the vision projector loaded with it
    vision: bool = False  # it takes images (a projector that encodes them is loaded)

    @property
    def can_draft(self) -> bool:
        return self.mtp != "off"


@dataclass(frozen=True)
class ReadyEvent:
    """The handshake, sent before anything else."""

    protocol: int
    pid: int
    engine: EngineBuild
    max_draft: int  # the deepest n_max any model is asked for
    id: str | None = None
    type: str = "ready"


@dataclass(frozen=True)
class LoadedEvent:
    id: str | None
    model: ModelInfo
    type: str = "loaded"


@dataclass(frozen=True)
class PrefillEvent:
    """Prompt processing in progress: ``done`` of ``total`` prompt tokens are
    decoded. Sent before the first chunk (``done`` 0) and after each chunk of
    ``n_batch`` tokens, so a long prompt shows progress instead of silence."""

    id: str | None
    done: int
    total: int
    type: str = "prefill"


@dataclass(frozen=True)
class TokenEvent:
    id: str | None
    text: str  # a UTF-8-complete delta
    draft: bool = False  # it came from accepted draft tokens
    reasoning: bool = False  # text of the reply's thinking block (requests with split_reasoning)
    # with logprobs asked for: those of the tokens behind this text
    logprobs: list[TokenLogprobs] | None = None
    type: str = "token"


@dataclass(frozen=True)
class StatsEvent:
    id: str | None
    stats: StatsSnapshot
    type: str = "stats"


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int]


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's log-probability under the target's raw distribution (its verify
    row under speculation), and the ``top`` most likely tokens of that row."""

    token: str
    logprob: float
    bytes: list[int]
    top: list[TopLogprob]


@dataclass(frozen=True)
class DoneEvent:
    id: str | None
    finish_reason: str  # stop | length | cancelled | error
    stats: StatsSnapshot | None = None
    prompt_mode: str | None = None  # template | completion
    n_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None  # when the request asked for them, one per generated token
    stop: str | None = None  # the stop string that ended the reply, when one did
    type: str = "done"


@dataclass(frozen=True)
class TokensEvent:
    """The answer to ``tokenize``: the tokens, each one's text (bytes a piece splits are shown
    as U+FFFD), and the whole text they make."""

    id: str | None
    tokens: list[int]
    pieces: list[str]
    text: str
    type: str = "tokens"


@dataclass(frozen=True)
class ErrorEvent:
    id: str | None
    kind: str
    message: str
    final: bool = True
    type: str = "error"


@dataclass(frozen=True)
class AckEvent:
    """The final event of a ``cancel``: ``target`` is the generate request it
    reached (that one then ends with ``done``, finish_reason "cancelled"),
    or null when none was running or waiting."""

    id: str | None
    target: str | None = None
    type: str = "ack"


@dataclass(frozen=True)
class UnloadedEvent:
    id: str | None
    type: str = "unloaded"


@dataclass(frozen=True)
class ByeEvent:
    id: str | None
    type: str = "bye"


Event = (ReadyEvent | LoadedEvent | PrefillEvent | TokenEvent | StatsEvent | DoneEvent | TokensEvent | ErrorEvent
         | AckEvent | UnloadedEvent | ByeEvent)

EVENTS: dict[str, type] = {
    "ready": ReadyEvent,
    "loaded": LoadedEvent,
    "prefill": PrefillEvent,
    "token": TokenEvent,
    "stats": StatsEvent,
    "done": DoneEvent,
    "tokens": TokensEvent,
    "error": ErrorEvent,
    "ack": AckEvent,
    "unloaded": UnloadedEvent,
    "bye": ByeEvent,
}


def is_final(event: Event) -> bool:
    """Does this event end its request?"""
    if isinstance(event, ErrorEvent):
        return event.final
    return isinstance(event, LoadedEvent | DoneEvent | TokensEvent | AckEvent | UnloadedEvent | ByeEvent)


def decode_event(line: str | bytes) -> Event:
    """Parse and check an event line from the worker.

    Raises:
        ProtocolError: not JSON, not an object, an unknown type, or a bad field.
    """
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"the worker wrote a line that is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("the worker wrote something that is not an event object")
    kind = data.get("type")
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"the worker sent an unknown event type {kind!r}")
    event: Event = build(cls, data, str(kind))
    return event


def stats_from_json(data: Any) -> StatsSnapshot | None:
    """Statistics stored with a reply (a JSON object), checked; None when unreadable."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("mode"), str) and "settings" not in data:  # stored by protocol 4 or older
        settings = settings_of_stored_mode(data["mode"]).to_json()
        data = {**{k: v for k, v in data.items() if k != "mode"}, "settings": settings}
    try:
        return build(StatsSnapshot, data, "stats")  # type: ignore[no-any-return]
    except ProtocolError:
        return None

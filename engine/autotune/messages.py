"""What ``mtp-studio autotune --jsonl`` prints, one JSON object per line:
frozen dataclasses, checked field by field when read (as the worker's
events are), so the wizard reads attributes, never keys."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.errors import ProtocolError
from engine.speculative.settings import SpeculativeSettings
from engine.worker.fields import build


@dataclass(frozen=True)
class HardwareMessage:
    fingerprint: str
    cpu: str
    cores: int
    backend: str | None = None
    type: str = "hardware"


@dataclass(frozen=True)
class ModelMessage:
    heads: int
    mtp: str  # off | single | chained
    rollback: str
    type: str = "model"


@dataclass(frozen=True)
class ProgressMessage:
    """One setting measured on one more prompt."""

    step: int
    total: int
    setting: str  # its label
    tps: float
    ratio: float  # mean speed relative to "off" so far
    acceptance: float | None = None
    type: str = "progress"


@dataclass(frozen=True)
class ResultRow:
    setting: str
    tps: float
    ratio: float
    lower: float  # one-sided 95 % lower bound on the ratio
    acceptance: float | None
    prompts: int
    identical: bool
    identity: str  # identical | near_tie | defect (engine/generation/identity.py)
    dropped: bool  # successive halving stopped measuring it
    per_pos: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ThreadRow:
    threads: int
    tps: float
    ratio: float  # vs the baseline count
    lower: float


@dataclass(frozen=True)
class ThreadsMessage:
    """Thread counts timed for the target (``what="decode"``) or the draft context (``"draft"``)."""

    what: str
    threads: int  # the chosen count
    baseline: int
    reason: str
    rows: list[ThreadRow]
    type: str = "threads"


@dataclass(frozen=True)
class ConcurrencyRow:
    setting: str  # its label
    tps: float  # total tokens/s of the N sequences
    ratio: float  # vs "off" at the same N
    lower: float


@dataclass(frozen=True)
class ConcurrencyMessage:
    """The settings timed with ``n`` sequences decoded together, and the choice for ``n``."""

    n: int
    best: SpeculativeSettings
    reason: str
    rows: list[ConcurrencyRow]
    type: str = "concurrency"


@dataclass(frozen=True)
class ResultMessage:
    best: SpeculativeSettings
    label: str
    reason: str
    rows: list[ResultRow]
    threads: int = 0  # decode threads chosen (0: not measured)
    threads_draft: int = 0  # draft context threads chosen (0: the same as threads)
    sampling: str = "greedy"  # the sampling the speeds were measured with (engine.sampling.sampling_key)
    # the MTP head's draft vocabulary chosen (engine/autotune/draft_vocab.py; 0: the whole vocabulary),
    # None where it was not measured (no head, or a vocabulary too small for a cut to matter)
    draft_vocab: int | None = None
    draft_vocab_reason: str = ""
    type: str = "result"


Message = HardwareMessage | ModelMessage | ProgressMessage | ThreadsMessage | ConcurrencyMessage | ResultMessage
MESSAGES: dict[str, type] = {"hardware": HardwareMessage, "model": ModelMessage, "progress": ProgressMessage,
                             "threads": ThreadsMessage, "concurrency": ConcurrencyMessage, "result": ResultMessage}


def encode(message: Message) -> str:
    return json.dumps(asdict(message))


def decode(data: dict[str, Any]) -> Message:
    """A message from its JSON object.

    Raises:
        ProtocolError: an unknown type or a bad field, named.
    """
    kind = data.get("type")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"autotune printed an unknown message type {kind!r}")
    message: Message = build(cls, data, str(kind))
    return message

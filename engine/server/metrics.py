"""What the server has done: counters for ``/metrics`` (Prometheus text
format) and a bounded log of recent requests for the app's panel.

Names follow llama-server's ``/metrics`` where one exists
(``llamacpp:prompt_tokens_total``, ``llamacpp:tokens_predicted_total``,
``llamacpp:predicted_tokens_seconds``, ``llamacpp:requests_processing``,
``llamacpp:requests_deferred``, ...); what llama-server has no name for is
``mtpstudio:*`` (requests by outcome, drafted and accepted tokens, acceptance
per draft position and per sequence).

Acceptance per sequence (``mtpstudio:sequence_*{sequence="k"}``, with
``serve --parallel N``) is there because a sequence can lose its drafts alone:
llama-server's slots above 0 have fallen to 0 % acceptance while slot 0 kept
its rate (llama.cpp #27572), which the totals hide.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.speculative.stats import StatsSnapshot

LOG_SIZE = 200


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, as the panel's log shows it. Never holds the prompt or the key."""

    when: float
    endpoint: str  # chat | completions
    status: int  # the HTTP status answered (a stream that failed mid-way keeps its 200)
    outcome: str  # stop | length | cancelled | disconnected | timeout | error | rejected | unauthorized
    stream: bool
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    decode_tps: float | None = None
    acceptance_rate: float | None = None
    speculative: str = "off"
    finish: str | None = None  # the worker's finish reason (cancelled after a disconnect), None if it never ran
    sequence: int | None = None  # the sequence that decoded it, where the server decodes several at once

    def line(self) -> str:
        """How the request log shows it."""
        stamp = time.strftime("%H:%M:%S", time.localtime(self.when))
        tps = f"{self.decode_tps:.1f} tok/s" if self.decode_tps else "– tok/s"
        acc = f"accept {self.acceptance_rate:.0%}" if self.acceptance_rate is not None else "no drafts"
        kind = "stream" if self.stream else "whole"
        if self.outcome in ("rejected", "unauthorized"):
            return f"{stamp}  {self.status}  /{self.endpoint}  {self.outcome}"
        seq = f"  sequence {self.sequence}" if self.sequence is not None else ""
        return (f"{stamp}  {self.status}  /{self.endpoint} ({kind})  {self.outcome}  "
                f"in {self.prompt_tokens} / out {self.completion_tokens} tok  {self.seconds:.2f} s  {tps}  "
                f"{acc}  [{self.speculative}]{seq}")


@dataclass
class SequenceCounts:
    """What one sequence of the context decoded: requests, and their drafted and accepted tokens."""

    requests: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class Metrics:
    """Counters, thread-safe; ``on_record`` hears each finished request (the panel's log)."""

    requests: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    predicted_tokens: int = 0
    predicted_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    per_sequence: dict[int, SequenceCounts] = field(default_factory=dict)  # the sequences that decoded requests
    processing: int = 0  # requests running now: with serve --parallel N, up to N decoded together
    sequences: int = 1  # how many may run at once (ServerConfig.parallel)
    deferred: int = 0
    recent: collections.deque[RequestRecord] = field(default_factory=lambda: collections.deque(maxlen=LOG_SIZE))
    on_record: Callable[[RequestRecord], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_stats(self, stats: StatsSnapshot, n_tokens: int) -> None:
        prefill = stats.phase_seconds.get("prefill", 0.0)
        with self._lock:
            self.prompt_tokens += stats.prompt_tokens
            self.prompt_seconds += prefill
            self.predicted_tokens += n_tokens
            self.predicted_seconds += max(stats.elapsed - prefill, 0.0)
            self.drafted += stats.drafted
            self.accepted += stats.accepted
            for mine, theirs in ((self.drafted_per_pos, stats.drafted_per_pos),
                                 (self.accepted_per_pos, stats.accepted_per_pos)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, n in enumerate(theirs):
                    mine[i] += n
            counts = self.per_sequence.setdefault(stats.sequence, SequenceCounts())
            counts.requests += 1
            counts.drafted += stats.drafted
            counts.accepted += stats.accepted

    def record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests[(record.endpoint, record.outcome)] += 1
            self.recent.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def prometheus(self) -> str:
        """The counters in Prometheus text exposition format (version 0.0.4)."""
        with self._lock:
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

            metric("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.",
                   [("", self.prompt_tokens)])
            metric("llamacpp:prompt_seconds_total", "counter", "Prompt process time", [("", self.prompt_seconds)])
            metric("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.",
                   [("", self.predicted_tokens)])
            metric("llamacpp:tokens_predicted_seconds_total", "counter", "Predict process time",
                   [("", self.predicted_seconds)])
            metric("llamacpp:prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.",
                   [("", self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0)])
            metric("llamacpp:predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.",
                   [("", self.predicted_tokens / self.predicted_seconds if self.predicted_seconds else 0.0)])
            metric("llamacpp:requests_processing", "gauge", "Number of requests processing.",
                   [("", self.processing)])
            metric("mtpstudio:sequences", "gauge", "Requests the engine decodes together at most (--parallel).",
                   [("", self.sequences)])
            metric("llamacpp:requests_deferred", "gauge", "Number of requests deferred (waiting in the queue).",
                   [("", self.deferred)])
            metric("mtpstudio:requests_total", "counter", "Finished requests by endpoint and outcome.",
                   [(f'{{endpoint="{_label(e)}",outcome="{_label(o)}"}}', n)
                    for (e, o), n in sorted(self.requests.items())])
            metric("mtpstudio:draft_tokens_total", "counter", "Draft tokens proposed by the MTP head(s).",
                   [("", self.drafted)])
            metric("mtpstudio:draft_tokens_accepted_total", "counter", "Draft tokens the target accepted.",
                   [("", self.accepted)])
            metric("mtpstudio:draft_acceptance_rate", "gauge", "Accepted / drafted tokens since the start.",
                   [("", self.accepted / self.drafted if self.drafted else 0.0)])
            metric("mtpstudio:draft_tokens_per_position_total", "counter", "Draft tokens proposed at each position.",
                   [(f'{{position="{i + 1}"}}', n) for i, n in enumerate(self.drafted_per_pos)])
            metric("mtpstudio:draft_tokens_accepted_per_position_total", "counter",
                   "Draft tokens accepted at each position.",
                   [(f'{{position="{i + 1}"}}', n) for i, n in enumerate(self.accepted_per_pos)])
            metric("mtpstudio:draft_acceptance_per_position", "gauge",
                   "Accepted / drafted tokens at each draft position since the start.",
                   [(f'{{position="{i + 1}"}}', a / d if d else 0.0)
                    for i, (d, a) in enumerate(zip(self.drafted_per_pos, self.accepted_per_pos, strict=False))])
            per_seq = sorted(self.per_sequence.items())
            metric("mtpstudio:sequence_requests_total", "counter", "Requests each sequence decoded.",
                   [(f'{{sequence="{s}"}}', c.requests) for s, c in per_seq])
            metric("mtpstudio:sequence_draft_tokens_total", "counter", "Draft tokens proposed in each sequence.",
                   [(f'{{sequence="{s}"}}', c.drafted) for s, c in per_seq])
            metric("mtpstudio:sequence_draft_tokens_accepted_total", "counter",
                   "Draft tokens the target accepted in each sequence.",
                   [(f'{{sequence="{s}"}}', c.accepted) for s, c in per_seq])
            metric("mtpstudio:sequence_draft_acceptance_rate", "gauge",
                   "Accepted / drafted tokens in each sequence since the start.",
                   [(f'{{sequence="{s}"}}', c.accepted / c.drafted if c.drafted else 0.0) for s, c in per_seq])
            return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A label value as the text format needs it escaped (a refused request's path is the client's text)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

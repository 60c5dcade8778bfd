"""Exact generation statistics, plain and speculative.

Definitions (also in docs/statistics.md):

- **round**: one target verify decode that checked at least one drafted
  token. A step whose draft came back empty (gated by ``p_min``/``n_min``)
  is a plain step, not a round.
- **drafted**: draft tokens sent to the target for verification.
- **accepted**: drafted tokens the target's own sampling agreed with (the
  bonus token the target always produces is not counted).
- **acceptance rate** = accepted / drafted.
- **acceptance at position i** = rounds where draft position i was accepted /
  rounds where position i was drafted.
- **mean accepted length** = 1 + accepted / rounds (it counts the bonus token).
- **per source** (``mtp``, ``ngram``): drafted, accepted and rounds counted
  by what proposed the round's draft; each adds up to its total.
- **decode tok/s** = generated tokens after the first / time after the first
  token; **end-to-end tok/s** = generated tokens / (prefill + decode time).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine.speculative.settings import ADAPTIVE, MODES, OFF, SPECULATION_OFF, SpeculativeSettings

PHASES = ("prefill", "draft", "verify", "catch_up", "rollback", "sampling", "other")


@dataclass(frozen=True)
class StatsSnapshot:
    """The figures of one generation at one moment, as the worker sends them
    (``stats`` and ``done`` events) and the app shows and stores them."""

    # what ran: the request's settings after the model's limits (off: plain decoding)
    settings: SpeculativeSettings = SPECULATION_OFF
    rollback: str = "none"
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_reused: int = 0  # prompt tokens the target context already held (not decoded again)
    prompt_tps: float | None = None
    decode_tps: float | None = None
    end_to_end_tps: float | None = None
    elapsed: float = 0.0
    rounds: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    acceptance_per_pos: list[float] = field(default_factory=list)
    accepted_histogram: dict[str, int] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    # per draft source (mtp | ngram); each adds up to drafted / accepted / rounds
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    rounds_by_source: dict[str, int] = field(default_factory=dict)
    # the draft depth in force: adaptive depth's chosen length for the latest round (the drafter may stop
    # sooner), else the latest round's draft length; None: not drafting
    draft_depth: int | None = None
    # which of the contexts' sequences decoded it (0 where they hold one; several at once:
    # engine/generation/parallel.py), so that acceptance can be told per sequence (server /metrics)
    sequence: int = 0

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens each target decode produced: a round gives its accepted drafts + 1, a
        plain step 1. Not ``mean_accepted_length`` (per round only): ten plain steps and
        one fully accepted round of 3 are 14 / 11 = 1.27 tokens per step, not 4."""
        steps = self.rounds + self.plain_steps
        return (self.accepted + steps) / steps if steps else None

    @property
    def speculative(self) -> bool:
        """Did anything draft in this generation (MTP, n-gram or both)?"""
        return self.settings.enabled

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_reused: int = 0
    rounds: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_per_pos: list[int] = field(default_factory=list)
    accepted_per_pos: list[int] = field(default_factory=list)
    # accepted drafts per round -> how many rounds ended that way
    accepted_histogram: dict[int, int] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    t_start: float = field(default_factory=time.perf_counter)
    t_first_token: float | None = None
    t_end: float | None = None
    rollback: str = "none"
    settings: SpeculativeSettings = SPECULATION_OFF  # see StatsSnapshot.settings
    draft_depth: int | None = None  # see StatsSnapshot.draft_depth
    sequence: int = 0  # see StatsSnapshot.sequence
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    rounds_by_source: dict[str, int] = field(default_factory=dict)

    def record_round(self, n_drafted: int, n_accepted: int, source: str = "mtp") -> None:
        """Count one verify of ``n_drafted`` draft tokens of which ``n_accepted``
        were accepted, drafted by ``source``."""
        if n_drafted == 0:
            self.plain_steps += 1
            return
        self.rounds += 1
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.rounds_by_source[source] = self.rounds_by_source.get(source, 0) + 1
        self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + n_drafted
        self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + n_accepted
        while len(self.drafted_per_pos) < n_drafted:
            self.drafted_per_pos.append(0)
            self.accepted_per_pos.append(0)
        for i in range(n_drafted):
            self.drafted_per_pos[i] += 1
            if i < n_accepted:
                self.accepted_per_pos[i] += 1
        self.accepted_histogram[n_accepted] = self.accepted_histogram.get(n_accepted, 0) + 1

    # -- derived figures ----------------------------------------------------
    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted / self.rounds if self.rounds else None

    @property
    def acceptance_per_pos(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_pos, self.drafted_per_pos, strict=False)]

    def elapsed(self, now: float | None = None) -> float:
        end = self.t_end if self.t_end is not None else (now or time.perf_counter())
        return end - self.t_start

    def decode_tps(self, now: float | None = None) -> float | None:
        if self.t_first_token is None or self.generated_tokens < 2:
            return None
        end = self.t_end if self.t_end is not None else (now or time.perf_counter())
        span = end - self.t_first_token
        return (self.generated_tokens - 1) / span if span > 0 else None

    def prompt_tps(self) -> float | None:
        """Prompt tokens decoded per second of prefill (reused ones were not decoded)."""
        t, n = self.phase_seconds["prefill"], self.prompt_tokens - self.prompt_reused
        return n / t if t > 0 and n > 0 else None

    def end_to_end_tps(self, now: float | None = None) -> float | None:
        span = self.elapsed(now)
        return self.generated_tokens / span if span > 0 and self.generated_tokens else None

    def snapshot(self, now: float | None = None) -> StatsSnapshot:
        return StatsSnapshot(
            settings=self.settings,
            rollback=self.rollback,
            prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens,
            prompt_reused=self.prompt_reused,
            prompt_tps=self.prompt_tps(),
            decode_tps=self.decode_tps(now),
            end_to_end_tps=self.end_to_end_tps(now),
            elapsed=self.elapsed(now),
            rounds=self.rounds,
            plain_steps=self.plain_steps,
            drafted=self.drafted,
            accepted=self.accepted,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            drafted_per_pos=list(self.drafted_per_pos),
            accepted_per_pos=list(self.accepted_per_pos),
            acceptance_per_pos=self.acceptance_per_pos,
            accepted_histogram={str(k): v for k, v in sorted(self.accepted_histogram.items())},
            phase_seconds=dict(self.phase_seconds),
            drafted_by_source=dict(self.drafted_by_source),
            accepted_by_source=dict(self.accepted_by_source),
            rounds_by_source=dict(self.rounds_by_source),
            draft_depth=self.draft_depth,
            sequence=self.sequence,
        )

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        return self.snapshot(now).to_dict()


def settings_of_stored_mode(mode: str) -> SpeculativeSettings:
    """The settings behind a reply's statistics stored before they carried settings (protocol 4 and
    older wrote a label: ``off``, ``none``, ``mtp(n_max=3)``, ``mtp+ngram(adaptive, n_max=6)``)."""
    name, _, inside = mode.partition("(")
    if name not in MODES or name == OFF:
        return SPECULATION_OFF
    parts = [p.strip() for p in inside.rstrip(")").split(",")]
    n_max = next((int(p[6:]) for p in parts if p.startswith("n_max=") and p[6:].isdigit()), 3)
    try:
        return replace(SPECULATION_OFF, mode=name, n_max=n_max, depth=ADAPTIVE if ADAPTIVE in parts else "fixed")
    except ValueError:
        return replace(SPECULATION_OFF, mode=name)

"""How deep each round drafts: the one question the decode loop asks a policy.

A :class:`DepthPolicy` is told when a reply starts, chooses each round's draft
length, and is told what the round measured. Plain decoding and a fixed
``n_max`` are policies too (:class:`FixedDepth`), so the loop never asks
whether there is one; adaptive depth (engine/speculative/adaptive/) learns
acceptance and costs. Benchmarks and tests pass a policy to ``generate``.
"""

from __future__ import annotations

from typing import Protocol


class DepthPolicy(Protocol):
    """``new_reply`` once per generation, then per round ``choose`` and ``observe``.

    ``depth`` is the depth in force for the statistics (None: not drafting);
    ``shadow_probe`` says the round just chosen drafts without verifying (its
    draft is compared with the plain step's token instead).
    """

    depth: int | None

    @property
    def shadow_probe(self) -> bool: ...

    def new_reply(self, shadow_probes: bool = False) -> None: ...

    def choose(self, room: int) -> int: ...

    def observe(self, n_drafted: int, n_accepted: float, verify_s: float, draft_s: float, round_s: float,
                shadow: bool = False) -> None: ...


class FixedDepth:
    """Every round drafts up to ``n_max`` (0: plain decoding); ``depth`` is the latest round's draft."""

    shadow_probe = False

    def __init__(self, n_max: int) -> None:
        self.n_max = n_max
        self.depth: int | None = None

    def new_reply(self, shadow_probes: bool = False) -> None:
        self.depth = None

    def choose(self, room: int) -> int:
        return max(0, min(self.n_max, room))

    def observe(self, n_drafted: int, n_accepted: float, verify_s: float, draft_s: float, round_s: float,
                shadow: bool = False) -> None:
        if self.n_max:
            self.depth = n_drafted


PLAIN = FixedDepth(0)

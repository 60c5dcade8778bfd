"""Speculative settings: the one type every layer passes, from the settings
dialog to the drafter.

Names follow llama.cpp's ``common/speculative.h`` (``n_max``, ``n_min``,
``p_min``) because users know them from its command line. The deepest draft
any drafter is asked for is decided here (:data:`MAX_DRAFT`, and
:func:`deepest_draft` for a loaded model); the worker reports it, and the
app's limits come from that report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

OFF = "off"
MTP = "mtp"
MODES = (OFF, MTP)
# The deepest draft a looped single head is asked for. It also sizes the
# target's verify batch and the recurrent snapshots of hybrid targets.
MAX_DRAFT = 8


def deepest_draft(n_heads: int, chained: bool) -> int:
    """The largest ``n_max`` worth asking a model for: its head count when the
    heads are chained (one head per position), else :data:`MAX_DRAFT`; 0
    without heads."""
    if n_heads <= 0:
        return 0
    return min(n_heads, MAX_DRAFT) if chained else MAX_DRAFT


@dataclass(frozen=True)
class SpeculativeSettings:
    """How one generation drafts. Checked when made: a bad value never travels.

    Attributes:
        mode: ``"off"`` (plain decoding) or ``"mtp"``.
        n_max: most draft tokens per round, 1..MAX_DRAFT (a model with fewer
            chained heads drafts at most its head count).
        n_min: a draft shorter than this is discarded (the step decodes plainly).
        p_min: stop drafting at the first token whose probability is below this.

    Raises:
        ValueError: a value out of range (the protocol turns it into a
            ``protocol`` error naming the field).
    """

    mode: str = OFF
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, not {self.mode!r}")
        if isinstance(self.n_max, bool) or not isinstance(self.n_max, int) or not 1 <= self.n_max <= MAX_DRAFT:
            raise ValueError(f"n_max must be an integer from 1 to {MAX_DRAFT}, not {self.n_max!r}")
        if isinstance(self.n_min, bool) or not isinstance(self.n_min, int) or self.n_min < 0:
            raise ValueError(f"n_min must be a non-negative integer, not {self.n_min!r}")
        if isinstance(self.p_min, bool) or not isinstance(self.p_min, int | float) or self.p_min < 0.0:
            raise ValueError(f"p_min must be a probability (0 or more; above 1 drafts nothing), not {self.p_min!r}")

    @property
    def enabled(self) -> bool:
        return self.mode == MTP

    @property
    def label(self) -> str:
        """How a person reads it: ``off``, ``mtp n_max=3 p_min=0.5``."""
        if not self.enabled:
            return OFF
        return f"mtp n_max={self.n_max}" + (f" p_min={self.p_min:g}" if self.p_min else "")

    def limited_to(self, deepest: int) -> SpeculativeSettings:
        """These settings for a model that drafts at most ``deepest`` tokens."""
        if not self.enabled or self.n_max <= deepest:
            return self
        return replace(self, n_max=max(1, deepest)) if deepest > 0 else replace(self, mode=OFF)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeculativeSettings:
        """Settings from JSON, old spellings included: profiles written before
        "off" had one name say ``mode: "none"`` (and ``n_max: 0`` for off)."""
        mode = data.get("mode", OFF)
        n_max = data.get("n_max", 3)
        if mode == "none" or not n_max:
            mode, n_max = OFF, 3 if not n_max else n_max
        return cls(mode, int(n_max), int(data.get("n_min", 0)), float(data.get("p_min", 0.0)))


SPECULATION_OFF = SpeculativeSettings()


def mtp(n_max: int = 3, p_min: float = 0.0, n_min: int = 0) -> SpeculativeSettings:
    """MTP drafting with these limits (a shorthand for tests and tools)."""
    return SpeculativeSettings(MTP, n_max, n_min, p_min)

"""Where a generation's time goes, phase by phase: ``with clock("verify") as lap: ...``.

The loop times each phase where it happens and reads a lap's seconds where a
policy needs them (the verify time adaptive depth learns), instead of pairs of
``perf_counter()`` calls around every step.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Lap:
    seconds: float = 0.0


class PhaseClock:
    """Adds each timed block's seconds to ``phase_seconds[phase]``."""

    def __init__(self, phase_seconds: dict[str, float]) -> None:
        self.phase_seconds = phase_seconds

    @contextmanager
    def __call__(self, phase: str) -> Iterator[Lap]:
        lap, start = Lap(), time.perf_counter()
        try:
            yield lap
        finally:
            lap.seconds = time.perf_counter() - start
            self.phase_seconds[phase] += lap.seconds

"""The tunable numbers of adaptive depth, in one frozen, checked value.

An A/B of the policy is ``AdaptiveDepth(n_max, AdaptiveParams(decay=0.9))``:
no module constant is patched, and a bad value fails when it is made.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# The contexts acceptance is counted in: the last drafting round kept every draft / lost one; a reply's
# first rounds, before it drafted, use the pooled counts (the last reply's end says little).
AFTER_FULL, AFTER_MISS, FRESH = 0, 1, 2


@dataclass(frozen=True)
class AdaptiveParams:
    """What the policy assumes before it measured, and how fast it forgets.

    Acceptance (adaptive/acceptance.py):
        decay: per observation of a position; ~20 recent rounds carry most weight.
        idle_decay: per round whose draft stops short of a position: its evidence fades to the prior.
        prior_weight: pseudo-observations behind the prior of each position.
        context_prior_weight: pseudo-observations of the pooled ``q_i`` behind a context's own.
        prior_first: prior acceptance of position 0, optimistic enough to try drafting at all.
    Costs (adaptive/costs.py):
        prior_row_slope: ``verify(k) / verify(1) - 1`` per extra row before two sizes were timed,
            and the most a row past the largest timed size is assumed to add.
        prior_draft_share: one draft step / one verify row, before a draft was timed.
        cost_ema: weight of the newest timing in the moving averages.
        cost_clip: a timing is clipped to this factor of its average before it counts, so one
            preempted decode (another program took the core) cannot make a depth look slow for good.
        clip_after: samples behind an average before its samples are clipped.
    Probes (adaptive/probes.py):
        probe_first: plain steps before the first probe when drafting does not pay.
        probe_max: the longest wait between probes.
        hazard_prior: easy stretches found per plain step searched, before any were counted.
        hazard_prior_steps: plain steps' worth of weight behind that prior.
        hazard_decay: per plain step searched.
        recheck_plain: between plain steps the choice is made again every this many (~0.1 ms each).
        plain_check: drafting rounds in a row after which plain steps are taken to time one (two: only
            a plain step after a plain step is timed), so a plain step's cost is measured rather than
            modelled (0: never).
        shadow_probes: probe without verifying where the drafter allows it (the MTP head alone):
            the plain step's own token says whether the draft would have been accepted.
    """

    decay: float = 0.95
    idle_decay: float = 0.97
    prior_weight: float = 1.0
    context_prior_weight: float = 2.0
    prior_first: float = 0.6
    prior_row_slope: float = 0.4
    prior_draft_share: float = 0.2
    cost_ema: float = 0.2
    cost_clip: float = 1.5
    clip_after: int = 3
    probe_first: int = 8
    probe_max: int = 64
    hazard_prior: float = 1 / 32
    hazard_prior_steps: float = 32.0
    hazard_decay: float = 0.99
    recheck_plain: int = 4
    plain_check: int = 32
    shadow_probes: bool = True

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "shadow_probes":
                if not isinstance(value, bool):
                    raise ValueError(f"shadow_probes must be true or false, not {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{f.name} must be a non-negative number, not {value!r}")
        for name in ("decay", "idle_decay", "prior_first", "cost_ema", "hazard_decay", "hazard_prior"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {getattr(self, name)!r}")
        if self.cost_clip < 1.0:
            raise ValueError(f"cost_clip must be 1 or more, not {self.cost_clip!r}")
        for name in ("prior_weight", "context_prior_weight", "hazard_prior_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)!r}")
        for name in ("clip_after", "probe_first", "probe_max", "recheck_plain"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, not {getattr(self, name)!r}")
        if not isinstance(self.plain_check, int):
            raise ValueError(f"plain_check must be a whole number of rounds, not {self.plain_check!r}")
        if self.probe_first > self.probe_max:
            raise ValueError(f"probe_first ({self.probe_first}) must not exceed probe_max ({self.probe_max})")

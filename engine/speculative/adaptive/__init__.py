"""Online adaptive draft depth, in three nouns: acceptance, costs, probes (and a short policy).

Why: the best fixed ``n_max`` depends on how predictable the text is, and real
replies mix easy stretches (boilerplate, quoted code) with hard ones
(reasoning), so the right depth changes from round to round. A fixed depth is
the best any anchor offers; this policy follows the text. The numbers it
tunes are one :class:`AdaptiveParams`; docs/mtp.md explains the model.
"""

from engine.speculative.adaptive.acceptance import Acceptance
from engine.speculative.adaptive.costs import Costs
from engine.speculative.adaptive.params import AFTER_FULL, AFTER_MISS, FRESH, AdaptiveParams
from engine.speculative.adaptive.policy import AdaptiveDepth
from engine.speculative.adaptive.probes import Probes

__all__ = ["AFTER_FULL", "AFTER_MISS", "FRESH", "Acceptance", "AdaptiveDepth", "AdaptiveParams", "Costs", "Probes"]

"""Acceptance with matched and with probabilistic draft sampling, at temperatures 0.7 and 1.0.

    .venv/bin/python scripts/draft_sampling_gain.py [--seeds 8] [--tokens 96] [--arch glm4moe step35 qwen35]

Synthetic oracle models whose LM heads are scaled down (``logit_scale`` 0.5), so sampling at
temperature 1 spreads over several tokens, with heads that agree with the target on 100 % and on
70 % of tokens (elsewhere they draft another word). Each line: drafts accepted / drafted and
accepted tokens per round, mean over seeds, for "match" (the head's top token, kept while it equals
the target's sample) and "probabilistic" (a sample of the head's distribution, kept by rejection
sampling; engine/speculative/rejection.py). Sampling: top-k 40, top-p 0.95, min-p 0.05, no penalties.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generation.generator import GenerateRequest, generate  # noqa: E402
from engine.generation.session import LoadOptions, Session  # noqa: E402
from engine.sampling import SamplingParams  # noqa: E402
from engine.speculative.settings import MATCH, PROBABILISTIC, mtp  # noqa: E402
from engine.synth import HeadMap, SynthModel, SynthSpec  # noqa: E402
from engine.synth.spec import default_heads  # noqa: E402

PROMPT = "the quick brown fox"


def measure(session: Session, draft_sampling: str, temperature: float, seeds: int, tokens: int) -> tuple[float, float]:
    rates, per_round = [], []
    for seed in range(seeds):
        r = generate(session, GenerateRequest(prompt=PROMPT, max_tokens=tokens,
                                              speculative=mtp(3, draft_sampling=draft_sampling),
                                              sampling=SamplingParams(temperature=temperature, seed=seed)))
        rates.append(sum(r.accepted_per_round) / max(1, sum(r.drafted_per_round)))
        per_round.append(sum(r.accepted_per_round) / max(1, len(r.drafted_per_round)))
    return mean(rates), mean(per_round)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--arch", nargs="+", default=["glm4moe", "step35", "qwen35"])
    args = p.parse_args()
    print("arch     agree  temp  match: accepted/drafted per-round   probabilistic: accepted/drafted per-round")
    for arch in args.arch:
        for agree in (1.0, 0.7):
            model = SynthModel(SynthSpec(arch=arch, n_heads=default_heads(arch), heads=(HeadMap(agree=agree),),
                                         logit_scale=0.5))
            session = Session(LoadOptions(path=str(model.path("combined")), n_ctx=512))
            try:
                for temperature in (0.7, 1.0):
                    m_rate, m_round = measure(session, MATCH, temperature, args.seeds, args.tokens)
                    p_rate, p_round = measure(session, PROBABILISTIC, temperature, args.seeds, args.tokens)
                    print(f"{arch:8} {agree:5.1f} {temperature:5.1f}  {m_rate:22.3f} {m_round:9.2f}"
                          f"   {p_rate:30.3f} {p_round:9.2f}", flush=True)
            finally:
                session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""MTP acceptance under a grammar: free text, a JSON schema with the head drafting freely, and the
same schema with the head's drafts guided by the grammar (engine/runtime/sampler.py, DraftGuide).

    .venv/bin/python scripts/grammar_acceptance.py [--tokens 120] [--n-max 3]

Prints one row per synthetic model and mode: tokens, drafted, accepted, acceptance rate and
tokens per second (one thread). Greedy output is the same in every grammar row (the tests check it).
"""

from __future__ import annotations

import argparse
import time

from engine.generation import grammars
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SpeculativeSettings
from engine.synth import HeadMap, SynthModel, SynthSpec
from engine.synth.spec import default_heads

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ids", "ok", "kind", "note"],
          "properties": {"ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 999},
                                 "minItems": 4, "maxItems": 4},
                         "ok": {"type": "boolean"}, "kind": {"enum": ["river", "valley", "model"]},
                         "note": {"type": "string", "maxLength": 24}}}
MODELS = [("glm4moe", "oracle", "token"), ("glm4moe", "mixed", "hidden"), ("qwen35", "mixed", "hidden"),
          ("step35", "random", "hidden")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--n-max", type=int, default=3)
    args = parser.parse_args()
    gbnf = grammars.from_json_schema(SCHEMA)
    spec = SpeculativeSettings(mode="mtp", n_max=args.n_max)
    print(f"{'model':28} {'mode':16} {'tokens':>6} {'drafted':>7} {'accepted':>8} {'rate':>5} {'tok/s':>6}")
    for arch, weights, reads in MODELS:
        model = SynthModel(SynthSpec(arch=arch, n_heads=default_heads(arch), weights=weights,
                                     heads=(HeadMap(reads, 1.0, 0),), seed=5))
        session = Session(LoadOptions(path=str(model.path("combined")), n_ctx=1024))
        try:
            for mode, grammar, guided in (("free text", None, True), ("schema, free", gbnf, False),
                                          ("schema, guided", gbnf, True)):
                t0 = time.perf_counter()
                result = generate(session, GenerateRequest(prompt=" the river model", max_tokens=args.tokens,
                                                           speculative=spec, grammar=grammar, guided_drafts=guided))
                seconds = time.perf_counter() - t0
                st = result.stats
                rate = st.accepted / st.drafted if st.drafted else 0.0
                print(f"{arch + ' ' + weights + '/' + reads:28} {mode:16} {len(result.tokens):6} {st.drafted:7} "
                      f"{st.accepted:8} {rate:5.2f} {len(result.tokens) / seconds:6.1f}")
        finally:
            session.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What keeping the MTP head caught up costs several sequences when adaptive depth drafts (almost) nothing.

    .venv/bin/python scripts/parallel_mtp_upkeep.py [--seqs 8] [--max-tokens 32] [--repeats 2]

Runs the same greedy requests, one per sequence, all at once on the multi-sequence engine
(engine/generation/parallel.py, no server), with speculation off and with adaptive MTP depth,
alternating, on the bench-size glm4moe (oracle head, agree 0.8). Prints the wall time, and for each
context the decodes, the rows decoded and the seconds inside ``llama_decode``: with adaptive depth the
head still catches up on every accepted token (deferred and batched) so that it can draft as soon as
drafting pays; speculation off keeps no head at all (docs/parallel.md, "Known limits").
"""

from __future__ import annotations

import argparse
import time

from engine.generation.generator import GenerateRequest
from engine.generation.parallel import generate_together
from engine.generation.session import LoadOptions, Session
from engine.runtime import Context
from engine.speculative.settings import ADAPTIVE, SPECULATION_OFF, mtp
from engine.synth import HeadMap, SynthModel, SynthSpec

PROMPTS = [" the river model", " a quiet light", " numbers and words", " the old bridge",
           " one more time", " under the hill", " green and blue", " a letter home"]


def counted(ctx: Context, figures: list[float]) -> None:
    """Count ``ctx``'s decodes into ``figures`` (decodes, rows, seconds) until ``del ctx.decode``."""
    decode = type(ctx).decode

    def counting(batch):
        t0 = time.perf_counter()
        decode(ctx, batch)
        figures[0] += 1
        figures[1] += batch.n
        figures[2] += time.perf_counter() - t0

    ctx.decode = counting


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    path = str(SynthModel(SynthSpec(arch="glm4moe", size="bench", weights="oracle",
                                    heads=(HeadMap("token", 0.8, 0),))).path())
    print(f"{'setting':>9} {'wall s':>7} {'target decodes/rows/s':>22} {'MTP decodes/rows/s':>19} "
          f"{'drafted':>7} {'accepted':>8}")
    with Session(LoadOptions(path=path, n_ctx=512, parallel=args.seqs, n_threads=args.threads)) as session:
        generate_together(session, [GenerateRequest(prompt=PROMPTS[0], max_tokens=8)])  # warm-up
        for _ in range(args.repeats):
            for name, setting in (("off", SPECULATION_OFF), ("adaptive", mtp(3, depth=ADAPTIVE))):
                target, head = [0, 0, 0.0], [0, 0, 0.0]
                counted(session.target, target)
                counted(session.mtp_drafter.ctx, head)
                reqs = [GenerateRequest(prompt=PROMPTS[i % len(PROMPTS)] + " again", max_tokens=args.max_tokens,
                                        speculative=setting) for i in range(args.seqs)]
                t0 = time.perf_counter()
                results = generate_together(session, reqs)
                wall = time.perf_counter() - t0
                del session.target.decode, session.mtp_drafter.ctx.decode
                print(f"{name:>9} {wall:>7.2f} {target[0]:>7}/{target[1]}/{target[2]:.2f}"
                      f"{head[0]:>10}/{head[1]}/{head[2]:.2f} {sum(r.stats.drafted for r in results):>7} "
                      f"{sum(r.stats.accepted for r in results):>8}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

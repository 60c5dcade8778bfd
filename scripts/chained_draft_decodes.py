"""MTP-context decodes and tokens/s of several sequences drafting with chained heads (step35's three
NextN blocks), on the multi-sequence engine (engine/generation/parallel.py) without a server.

    .venv/bin/python scripts/chained_draft_decodes.py [--size bench] [--seqs 2,4] [--max-tokens 48]

For each number of sequences: one greedy request per sequence (different prompts), all at once, MTP
with ``--n-max`` heads; prints the draft decodes (MTP decodes with an output row), all MTP decodes
(catch-ups too), the tokens, the wall time and tokens/s, this process's CPU seconds per token (what
other load on a shared machine barely moves) and the accepted drafts. Run it on two commits to compare
them (docs/parallel.md); use ``--threads 1`` on a busy machine (llama.cpp's threads spin while they
wait, and against other load two threads made the wall time swing twentyfold).
"""

from __future__ import annotations

import argparse
import time

from engine.generation.generator import GenerateRequest
from engine.generation.parallel import generate_together
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import mtp
from engine.synth import HeadMap, SynthModel, SynthSpec

PROMPTS = [" the river model", " a quiet light", " numbers and words", " the old bridge",
           " one more time", " under the hill", " green and blue", " a letter home"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="bench")
    parser.add_argument("--agree", type=float, default=0.8, help="how often the oracle heads agree with the trunk")
    parser.add_argument("--seqs", default="2,4")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--n-max", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = SynthModel(SynthSpec(arch="step35", size=args.size, n_heads=3, weights="oracle",
                                 heads=(HeadMap("token", args.agree, 0),)))
    path = str(model.path())
    print(f"{'seqs':>4} {'draft decodes':>13} {'MTP decodes':>11} {'tokens':>6} {'wall s':>7} {'tok/s':>6} "
          f"{'CPU ms/tok':>10} {'accepted':>8}")
    for n_seq in (int(n) for n in args.seqs.split(",")):
        reqs = [GenerateRequest(prompt=PROMPTS[i % len(PROMPTS)], max_tokens=args.max_tokens,
                                speculative=mtp(args.n_max)) for i in range(n_seq)]
        with Session(LoadOptions(path=path, n_ctx=512, parallel=n_seq, n_threads=args.threads)) as session:
            generate_together(session, reqs[:1])  # warm-up
            ctx, counts = session.mtp_drafter.ctx, {"draft": 0, "all": 0}
            decode = ctx.decode

            def counting(batch, decode=decode, counts=counts):
                counts["all"] += 1
                counts["draft"] += batch.n_outputs > 0
                decode(batch)

            ctx.decode = counting
            t0, cpu0 = time.perf_counter(), time.process_time()
            results = generate_together(session, reqs)
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            ctx.decode = decode
        tokens = sum(len(r.tokens) for r in results)
        accepted = sum(r.stats.accepted for r in results)
        print(f"{n_seq:>4} {counts['draft']:>13} {counts['all']:>11} {tokens:>6} {wall:>7.2f} {tokens / wall:>6.1f} "
              f"{1000 * cpu / tokens:>10.1f} {accepted:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

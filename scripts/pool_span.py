"""What one pool of cells for every sequence costs a decode step as the sequences' contexts grow.

    .venv/bin/python scripts/pool_span.py [--seqs 8] [--words 10,60,120] [--tokens 64] [--repeats 2]

The multi-sequence engine keeps every sequence's cells in one pool by default (``LoadOptions.kv_unified``;
``serve --no-kv-unified`` gives each its own), so that a sequence can share another's prompt cells without copying
them and a batch of everyone's rows is one graph. llama.cpp's attention then spans the pool's used
cells for every row, masking the other sequences' out: a decode step's attention grows with the sum
of the sequences' contexts, not with each one's. llama-server with ``--parallel N`` keeps a pool per
sequence instead (``--no-kv-unified``). This runs the same greedy requests, one per sequence, all at
once (engine/generation/parallel.py, no server), with one pool and with a pool per sequence,
alternating, on the bench-size glm4moe, speculation off, and prints the mean time of the steps that
decode one row per sequence (the prompts' steps apart), for prompts of each length.
"""

from __future__ import annotations

import argparse
import time

from engine.generation.generator import GenerateRequest
from engine.generation.parallel import generate_together
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF
from engine.synth import HeadMap, SynthModel, SynthSpec

WORDS = ["river", "model", "quiet", "light", "numbers", "words", "bridge", "hill", "green", "blue", "letter", "home"]


def run(path: str, unified: bool, seqs: int, words: int, tokens: int, threads: int) -> tuple[float, float, int]:
    """(ms per one-row-per-sequence step, seconds in the other decodes, prompt tokens) for one round."""
    options = LoadOptions(path=path, n_ctx=2048, parallel=seqs, n_threads=threads, kv_unified=unified)
    with Session(options) as session:
        generate_together(session, [GenerateRequest(prompt=" the river", max_tokens=4)])  # warm-up
        steps: list[tuple[int, float]] = []
        decode = type(session.target).decode

        def timed(batch):
            t0 = time.perf_counter()
            decode(session.target, batch)
            steps.append((batch.n, time.perf_counter() - t0))

        session.target.decode = timed
        reqs = [GenerateRequest(prompt=f" {WORDS[i % 12]} {i} " + " ".join(WORDS[(i * 7 + k) % 12]
                                                                        for k in range(words)),
                                max_tokens=tokens, speculative=SPECULATION_OFF) for i in range(seqs)]
        results = generate_together(session, reqs)
    one_row = [dt for n, dt in steps if n <= seqs]
    return (1000 * sum(one_row) / max(1, len(one_row)), sum(dt for n, dt in steps if n > seqs),
            sum(r.stats.prompt_tokens for r in results))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=8)
    parser.add_argument("--words", default="10,60,120", help="words per prompt (a context length each)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    path = str(SynthModel(SynthSpec(arch="glm4moe", size="bench", weights="oracle",
                                    heads=(HeadMap("token", 0.8, 0),))).path())
    print(f"{args.seqs} sequences, {args.tokens} tokens each, speculation off; medians of {args.repeats} runs")
    print(f"{'prompt tokens/seq':>17} {'one pool ms/step':>16} {'pool per seq':>12} {'ratio':>6} "
          f"{'prompt s (one / per seq)':>25}")
    for words in (int(w) for w in args.words.split(",")):
        one, per, n_prompt = [], [], 0
        for _ in range(args.repeats):  # alternating, so that a slow minute of the machine hits both
            a = run(path, True, args.seqs, words, args.tokens, args.threads)
            b = run(path, False, args.seqs, words, args.tokens, args.threads)
            one.append(a)
            per.append(b)
            n_prompt = a[2]
        ms_one = sorted(x[0] for x in one)[len(one) // 2]
        ms_per = sorted(x[0] for x in per)[len(per) // 2]
        s_one = sorted(x[1] for x in one)[len(one) // 2]
        s_per = sorted(x[1] for x in per)[len(per) // 2]
        print(f"{n_prompt // args.seqs:>17} {ms_one:>16.1f} {ms_per:>12.1f} {ms_one / ms_per:>6.2f} "
              f"{s_one:>12.2f} / {s_per:<10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

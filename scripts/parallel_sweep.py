"""Random conversations on several sequences at once, each reply checked against plain decoding.

    .venv/bin/python scripts/parallel_sweep.py [--archs qwen35,step35] [--seeds 1-6] [--n-batch 512] [--swa-full]

The identity tests (tests/engine/test_parallel.py) run schedules someone wrote down. This one draws
them: per seed, two conversations and two one-off requests on four sequences of a multi-sequence
session (engine/generation/parallel.py), joining at random steps, for three rounds in which the
conversations go on (their previous reply and a few new words: the sequence holding them reuses
it, a hybrid from its checkpoint) and the one-offs are replaced by new ones, long and short. The
speculation is the seed's: off, fixed-depth MTP 3, adaptive depth, in turn. Every reply is then
compared with the same request on a fresh one-sequence context with speculation off, reading its
prompt in chunks of the same size (``identity.classify_along``: a token that parted at a near-tie
within the noise measured where it parted is accepted, as the identity tests accept it), and the
drafts of each with the same request alone on one sequence with the same speculation (exactly,
except adaptive depth's, which drafts by timings; the heads read the hidden state, so drafts made
from another sequence's state would show).

Judge at the default ``--n-batch``: a prompt read in 16-token chunks or in one batch already differs
by ~0.01 in the logits on the tiny step35 (measured: 0.0094, no sequence but one), and a reply that
reused 294 tokens reads the rest in chunks that start elsewhere than the fresh run's, which the noise
measured along the reply does not see: small chunks show step35 replies parting at margins under that.

It found packaging/patches/0009 (a hybrid's snapshots left behind when llama.cpp moved its cell):
before it, qwen35 and qwen3next replies parted from plain decoding at margins of 0.35-1.6. Prints one
line per architecture and seed; exits 1 when a reply differs beyond noise.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import replace

from engine.generation import identity
from engine.generation.generator import GenerateRequest, GenerateResult, generate
from engine.generation.parallel import ParallelGenerator, generate_alone, generate_together
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF, mtp
from engine.synth import HeadMap, SynthModel, SynthSpec
from engine.synth.spec import ALL_ARCHITECTURES, default_heads

WORDS = "the river model quiet light numbers and words old bridge over firen lovi karen then them did".split()
SPECS = [SPECULATION_OFF, mtp(3), mtp(3, depth="adaptive")]
N_SEQ, ROUNDS = 4, 3


def model_path(arch: str) -> str:
    """The identity tests' model: mixed weights, heads reading the hidden state, agreeing 70 %."""
    spec = SynthSpec(arch=arch, n_heads=default_heads(arch), weights="mixed", heads=(HeadMap("hidden", 0.7, 0),))
    return str(SynthModel(spec).path())


def run(arch: str, seed: int, n_batch: int, swa_full: bool = False) -> tuple[int, int, int, list[str]]:
    """(replies, parted at a near-tie, drafts that differ, defects described) for one seed."""
    rng = random.Random(seed)
    spec = SPECS[seed % len(SPECS)]
    path = model_path(arch)

    def text(n: int) -> str:
        return " " + " ".join(rng.choice(WORDS) for _ in range(n))

    def request(prompt: str) -> GenerateRequest:
        return GenerateRequest(prompt=prompt, max_tokens=rng.randint(8, 24), speculative=spec, record_drafts=True)

    done: list[tuple[GenerateRequest, GenerateResult]] = []
    with Session(LoadOptions(path=path, n_ctx=512 * N_SEQ, parallel=N_SEQ, n_batch=n_batch,
                             swa_full=swa_full)) as session:
        engine = ParallelGenerator(session)
        conversations = [text(rng.randint(20, 60)) for _ in range(2)]
        for _ in range(ROUNDS):
            reqs = [request(c) for c in conversations] + [request(text(rng.randint(30, 120))), request(text(3))]
            rng.shuffle(reqs)
            starts = sorted(rng.randint(0, 6) for _ in reqs)
            results = generate_together(session, reqs, starts=starts, engine=engine)
            done += zip(reqs, results, strict=True)
            conversations = [r.prompt + out.text + text(rng.randint(3, 12))
                             for r, out in zip(reqs, results, strict=True) if r.prompt in conversations]
    alone, _noise = generate_alone(path, [r for r, _ in done], N_SEQ)
    near, drafts, defects = 0, 0, []
    for k, ((req, out), solo) in enumerate(zip(done, alone, strict=True)):
        # a model loaded again for each reply (prompt chunks of the same size): a context that served the reply
        # before, even emptied, places cells elsewhere, and that moved which partings read as near ties
        with Session(LoadOptions(path=path, n_ctx=2048, n_batch=n_batch)) as fresh:
            plain = generate(fresh, replace(req, speculative=SPECULATION_OFF, record_margins=True))
            if plain.tokens == out.tokens:
                # (adaptive depth drafts by timings: only its tokens are its own)
                if not spec.adaptive and out.tokens == solo.tokens and out.drafts_per_round != solo.drafts_per_round:
                    drafts += 1
                continue
            noise = identity.measure_noise(fresh)
            prompt = fresh.model.tokenize(req.prompt)
            verdict = identity.classify_along(fresh, prompt, plain.tokens, plain.margins, out.tokens, noise)
        if verdict.acceptable:
            near += 1
        else:
            defects.append(f"reply {k} ({out.stats.prompt_reused} prompt tokens reused): {verdict.describe()}")
    return len(done), near, drafts, defects


def seeds(text: str) -> list[int]:
    """``1-6``, ``4`` or ``1,4,7-9``."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--archs", default="qwen35,qwen3next,qwen35moe,glm4moe,step35,mimo2",
                   help=f"comma-separated, of {', '.join(ALL_ARCHITECTURES)}")
    p.add_argument("--seeds", default="1-6", help="seeds and ranges, e.g. 1-6 or 1,4,7-9")
    p.add_argument("--n-batch", type=int, default=512, help="prompt chunk size (16 makes prompts share many steps)")
    p.add_argument("--swa-full", action="store_true", help="a sliding-window model keeps every cell (not the window's)")
    args = p.parse_args(argv)
    bad = False
    for arch in args.archs.split(","):
        for seed in seeds(args.seeds):
            n, near, drafts, defects = run(arch, seed, args.n_batch, args.swa_full)
            spec = SPECS[seed % len(SPECS)].label
            print(f"{arch} seed {seed} ({spec}): {n} replies, {near} parted at a near tie, {drafts} with other "
                  f"drafts, {len(defects)} beyond noise", flush=True)
            for d in defects:
                print(f"  {d}", flush=True)
            bad = bad or bool(defects)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

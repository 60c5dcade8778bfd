"""Oracle token maps and the pure-Python simulator of MTP acceptance.

In an oracle model every block is an identity on the residual stream, so the
target's greedy next token after token t is f(t), a fixed permutation. Each
MTP head implements its own map g. The simulator replays the engine's rounds
(draft, verify, accept) from f and g alone, so a test can compare the
engine's accepted count, round by round, with what must happen.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.synth.spec import SynthSpec


@dataclass(frozen=True)
class OracleMaps:
    f: list[int]  # target: next(t) = f[t]
    heads: list[list[int]]  # head i drafts g_i[input]
    reads: list[str]  # per head: "token" or "hidden"
    n_normal: int  # tokens [0, n_normal) take part; the rest are control tokens


def build_maps(spec: SynthSpec, n_normal: int, first_word: int = 256) -> OracleMaps:
    """Draw f and each head's map from the seed.

    f permutes the word tokens [first_word, n_normal) and sends every byte
    token to a word, so generated text reads as words, never as stray bytes.
    """
    rng = random.Random(spec.seed * 7919 + 17)
    words = list(range(first_word, n_normal))
    perm = words[:]
    rng.shuffle(perm)
    f = [rng.choice(words) for _ in range(first_word)] + perm
    heads: list[list[int]] = []
    reads: list[str] = []
    stretches: dict[tuple[float, int], list[bool]] = {}  # chained heads share them: a stretch is easy for all
    for i in range(spec.n_heads):
        hm = spec.head(i)
        ideal = [f[f[t]] for t in range(n_normal)] if hm.reads == "hidden" else list(f)
        g = list(ideal)
        head_rng = random.Random(spec.seed * 104729 + 31 * i + 5)
        easy = None
        if hm.run:
            if (hm.agree, hm.run) not in stretches:
                stretches[(hm.agree, hm.run)] = _stretches(f, first_word, n_normal, hm.agree, hm.run, head_rng)
            easy = stretches[(hm.agree, hm.run)]
        for t in range(n_normal):
            if (head_rng.random() >= hm.agree) if easy is None else not easy[t]:
                wrong = head_rng.randrange(first_word, n_normal - 1)
                g[t] = wrong if wrong < ideal[t] else wrong + 1  # any word but the ideal
        heads.append(g)
        reads.append(hm.reads)
    return OracleMaps(f=f, heads=heads, reads=reads, n_normal=n_normal)


def _stretches(f: list[int], first_word: int, n_normal: int, agree: float, run: int,
               rng: random.Random) -> list[bool]:
    """Which tokens the head gets right when agreement comes in stretches of ``run``.

    Generated text follows f (each word's successor is f of it), so walking
    each cycle of the permutation in order and deciding per ``run`` words
    makes easy and hard stretches of the text itself. Byte tokens (only in
    prompts) are decided one by one.
    """
    easy = [rng.random() < agree for _ in range(n_normal)]
    seen = [False] * n_normal
    for start in range(first_word, n_normal):
        t, k, state = start, 0, False
        while not seen[t]:
            if k % run == 0:
                state = rng.random() < agree
            seen[t] = True
            easy[t] = state
            t, k = f[t], k + 1
    return easy


def simulate(maps: OracleMaps, prompt_last: int, prompt_prev: int | None, n_generate: int,
             n_max: int, chained: bool = False) -> tuple[list[int], list[int]]:
    """Greedy generation of ``n_generate`` tokens with MTP, from the prompt's last tokens.

    Args:
        prompt_last: the last prompt token (its target output is the first generated token).
        prompt_prev: unused for token-reading heads; for hidden-reading heads the
            trunk hidden state at the position before id_last carries this token.
        n_max: draft depth (capped at the head count when ``chained``).

    Returns:
        (generated tokens, accepted drafts per round) — the engine must match both.
    """
    f = maps.f
    out = [f[prompt_last]]
    prev = prompt_last  # token whose embedding h_target(pos0 - 1) carries
    accepted_rounds: list[int] = []
    depth = min(n_max, len(maps.heads)) if chained else n_max
    while len(out) < n_generate:
        id_last = out[-1]
        room = n_generate - len(out) - 1
        n = min(depth, room)
        drafts: list[int] = []
        token = id_last
        for i in range(n):
            g = maps.heads[i if chained else 0]
            reads = maps.reads[i if chained else 0]
            token = g[prev] if reads == "hidden" else g[token]
            drafts.append(token)
        k = 0
        expect = id_last
        for d in drafts:
            expect = f[expect]
            if d != expect:
                break
            k += 1
        new = drafts[:k] + [f[drafts[k - 1] if k else id_last]]
        if drafts:
            accepted_rounds.append(k)
        # pending_h becomes h_target at the last kept position, which carries that token
        prev = ([id_last] + drafts)[k]
        out.extend(new)
    return out[:n_generate], accepted_rounds

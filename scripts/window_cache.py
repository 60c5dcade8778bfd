"""A sliding-window model's cache: every cell kept (``swa_full``) against the window's alone (the default).

    .venv/bin/python scripts/window_cache.py [--turns 20] [--long 560]

On the built-in Gemma 3 270M (window 512; 15 of its 18 layers windowed), one thread:
1. what llama.cpp allocates for the KV cache at 8,192 and 32,768 tokens, each way;
2. a conversation growing by a paragraph and a 24-token reply a turn, sent to two sessions loaded each way,
   turn by turn one after the other (the first changing every turn): time to first token with reuse, where
   the window's copy at each prompt's end is the only extra work;
3. a reply longer than the cache's slack beyond the window (``--long`` tokens), then regenerated: the
   window-sized cache no longer holds the cells the prompt's end needs and goes back to its copy; the
   full-size one cuts back. Both should reuse all but the prompt's last token.
Greedy replies are compared between the two ways: the same tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine.default_model import default_model_path
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.store.fit import measure

PARAGRAPH = ("The river ran past the mill and the old bridge, and the people of the valley came down to the "
             "water in the morning to talk about the weather and the harvest.")


def reply(session: Session, prompt: str, tokens: int) -> tuple[float, int, list[int], str]:
    t0 = time.perf_counter()
    result = generate(session, GenerateRequest(prompt=prompt, max_tokens=tokens))
    first = result.stats.t_first_token if result.stats.t_first_token is not None else time.perf_counter()
    return first - t0, result.stats.prompt_reused, result.tokens, result.text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--long", type=int, default=560)
    args = parser.parse_args()
    path = str(default_model_path())

    print("KV cache allocated (MiB)")
    for n_ctx in (8192, 32768):
        kv = {full: measure(path, n_ctx=n_ctx, swa_full=full) for full in (False, True)}
        print(f"  n_ctx {n_ctx:>6}: window {kv[False].get('KV', 0):7.1f}   full {kv[True].get('KV', 0):7.1f}   "
              f"(all buffers {sum(kv[False].values()):.0f} against {sum(kv[True].values()):.0f})")

    sessions = {full: Session(LoadOptions(path=path, n_ctx=8192, n_threads=1, swa_full=full)) for full in (False, True)}
    try:
        print(f"\nconversation, {args.turns} turns, TTFT with reuse (ms)\nturn  reused  window  full  full/window")
        texts = {False: "", True: ""}
        ratios = []
        for turn in range(args.turns):
            got = {}
            for full in ((False, True) if turn % 2 == 0 else (True, False)):
                prompt = texts[full] + PARAGRAPH + f" (part {turn + 1})"
                got[full] = reply(sessions[full], prompt, 24)
                texts[full] = prompt + got[full][3]
            assert got[False][2] == got[True][2], f"turn {turn + 1}: the replies differ"
            ratios.append(got[True][0] / got[False][0])
            print(f"{turn + 1:>4}  {got[False][1]:>6}  {1000 * got[False][0]:6.0f}  {1000 * got[True][0]:4.0f}  "
                  f"{ratios[-1]:.2f}")
        print(f"median full / window: {statistics.median(ratios):.2f}")

        print(f"\na reply of {args.long} tokens, then regenerated")
        prompt = " ".join([PARAGRAPH] * 6)
        for full in (False, True):
            session = sessions[full]
            session.prefix.forget()
            _, _, first, _ = reply(session, prompt, args.long)
            ttft, reused, again, _ = reply(session, prompt, 8)
            n_prompt = len(session.model.tokenize(prompt, add_special=True, parse_special=True))
            print(f"  {'full' if full else 'window'}: regenerated TTFT {1000 * ttft:.0f} ms, reused {reused} of "
                  f"{n_prompt} prompt tokens; same reply: {again == first[:8]}")
    finally:
        for s in sessions.values():
            s.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does autotune choose well? Tune, then sweep every candidate on every prompt
(the exhaustive answer), on synthetic bench models at several acceptance
levels, in one run; report the tune's time and how its choice compares."""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.autotune import search
from engine.autotune.cli import load_prompts
from engine.generation.session import LoadOptions, Session
from engine.synth import HeadMap, SynthModel, SynthSpec


def check(arch: str, size: str, levels: list[float], tokens: int, threads: int, dense: bool,
          say: Callable[[str], None] = print) -> None:
    prompts = [[{"role": "user", "content": text}] for _, text in load_prompts(9)]
    for agree in levels:
        path = SynthModel(SynthSpec(arch=arch, size=size, dense=dense, n_heads=3 if arch == "step35" else 1,
                                    heads=(HeadMap("token", agree),))).path()
        session = Session(LoadOptions(path=str(path), n_ctx=2048, n_threads=threads))
        try:
            t0 = time.perf_counter()
            tuned = search.tune(session, prompts, max_tokens=tokens)
            tune_s = time.perf_counter() - t0
            drafter = session.mtp_drafter
            every = search.candidates(drafter.n_heads, drafter.chained) if drafter else [search.Setting(0)]
            # exhaustive: every candidate on every prompt (first_round = all prompts, nothing dropped)
            sweep = search.tune(session, prompts, max_tokens=tokens, first_round=len(prompts), settings=every)
        finally:
            session.close()
        ratio = {m.setting: m.mean_ratio for m in sweep.measurements}
        best = max(sweep.measurements, key=lambda m: m.mean_ratio)
        chosen = ratio[tuned.best]
        say(f"\n## head agreement {agree}: tune took {tune_s:.0f} s")
        say(f"tune chose {tuned.best.label}: {chosen:.3f}x off in the sweep; sweep best {best.setting.label} "
            f"{best.mean_ratio:.3f}x; chosen/best = {chosen / best.mean_ratio:.3f}; "
            f"chosen vs off = {chosen:.3f}x (must be >= 0.99)")
        say(sweep.table())

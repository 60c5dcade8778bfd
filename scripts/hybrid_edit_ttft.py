"""Time to first token of an edited last message on a hybrid (engine/generation/checkpoints.py).

A two-turn conversation on the bench-size qwen35 synthetic model (4,096 tokens, recurrent layers), then
its last message edited: the prompt parts after the first prompt's end and before the second's. With the
checkpoint of the previous prompt's end kept (two checkpoints, the default) the edit goes back there and
decodes the first reply and the edited message; with only the last prompt's (one) it prefilled the whole
conversation. The two alternate, each repeat from empty contexts. One thread, in process, plain decoding.

    .venv/bin/python scripts/hybrid_edit_ttft.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics

from engine.generation import checkpoints
from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF
from engine.synth import HeadMap, SynthModel, SynthSpec

PARAGRAPH = "The river ran past the old mill and the miller counted the boats. " * 12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = SynthModel(SynthSpec(arch="qwen35", size="bench", weights="oracle", heads=(HeadMap("token", 0.8, 0),)))
    runs: dict[int, list[tuple[float, int, int]]] = {2: [], 1: []}
    with Session(LoadOptions(path=str(model.path("combined")), n_ctx=4096, n_threads=1)) as session:

        def ttft(prompt: str) -> tuple[float, int, int, str]:
            r = generate(session, GenerateRequest(prompt=prompt, max_tokens=24, speculative=SPECULATION_OFF))
            first = r.stats.t_first_token if r.stats.t_first_token is not None else r.stats.t_start
            return 1000 * (first - r.stats.t_start), r.stats.prompt_reused, r.stats.prompt_tokens, r.text

        keep = checkpoints.KEEP
        try:
            for k in range(args.repeats):
                for kept in runs:
                    checkpoints.KEEP = kept
                    session.prefix.forget()
                    session.states.clear()
                    first = f"{k} " + PARAGRAPH * 2
                    reply = ttft(first)[3]
                    ttft(first + reply + " And then? " + PARAGRAPH)
                    ms, reused, prompt, _ = ttft(first + reply + " But why? " + PARAGRAPH)  # the last message edited
                    runs[kept].append((ms, reused, prompt))
        finally:
            checkpoints.KEEP = keep
    for kept, rows in runs.items():
        median = statistics.median(r[0] for r in rows)
        print(f"checkpoints kept {kept}: edited last message, TTFT median {median:.0f} ms "
              f"(runs {', '.join(f'{r[0]:.0f}' for r in rows)}), reused {rows[0][1]} of {rows[0][2]} prompt tokens")


if __name__ == "__main__":
    main()

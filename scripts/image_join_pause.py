"""How long a running reply pauses while a request with images joins it (engine/generation/parallel.py).

A text reply decodes on a two-sequence session of a synthetic qwen35 model (heads that read the hidden
state, MTP depth 2); three steps in, a request with four images (817 prompt rows with its text) joins.
Prints, per repeat, the longest gap between two of the running reply's tokens and the median gap. The
prompt with images is read a piece a step (a text piece, an image's encode, or its decode), so the longest
gap is about one image's decode; before, it was one image's encode and decode, and before that the whole
prompt's.

    .venv/bin/python scripts/image_join_pause.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine.generation.generator import GenerateRequest
from engine.generation.parallel import Job, ParallelGenerator
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import mtp
from engine.synth import HeadMap, SynthModel, SynthSpec
from engine.synth.images import BLUE, GREEN, RED, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path
from engine.worker import protocol as P


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = SynthModel(SynthSpec(arch="qwen35", n_heads=1, weights="mixed", heads=(HeadMap("hidden", 0.7, 0),),
                                 seed=1))
    path, mmproj = str(model.path("combined")), str(projector_path(ProjectorSpec(target=model.spec)))
    images = tuple(field_png([[RED, GREEN], [BLUE, YELLOW]], width=64 * (k + 1), height=64) for k in range(4))
    prompt = " ".join(f"picture {k}: {P.IMAGE_MARKER}" for k in range(4)) + " these show"
    with Session(LoadOptions(path=path, n_ctx=2048, parallel=2, mmproj=mmproj)) as session:
        engine = ParallelGenerator(session)
        for _ in range(args.repeats):
            stamps: list[float] = []
            text = Job(GenerateRequest(prompt=" the river model", max_tokens=60, speculative=mtp(2)),
                       on_text=lambda _text, _draft, stamps=stamps: stamps.append(time.perf_counter()))
            engine.add(text)
            for _ in range(3):
                engine.step()
            pictured = Job(GenerateRequest(prompt=prompt, images=images, max_tokens=8, speculative=mtp(2)))
            engine.add(pictured)
            while not engine.idle:
                engine.step()
            gaps = [1000 * (b - a) for a, b in zip(stamps, stamps[1:], strict=False)]
            assert pictured.result is not None
            print(f"longest pause of the running reply {max(gaps):.1f} ms, median gap {statistics.median(gaps):.2f} "
                  f"ms (the request with images: {pictured.result.stats.prompt_tokens} prompt rows)", flush=True)


if __name__ == "__main__":
    main()

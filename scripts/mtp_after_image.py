"""MTP acceptance on the text after an image: the image rows written into the MTP context
(``exact``: image embedding and h_target(p-1), patch 0007, the default; ``hidden``: h_target(p-1) in
both inputs, the fallback without the patch; ``embedding``) against llama.cpp's way (``skip``: no image
rows in the MTP context, a stale hidden state for the next text row). engine/speculative/mtp_images.py.

    .venv/bin/python scripts/mtp_after_image.py [--tokens 64] [--n-max 3]

One row per synthetic model (heads that read the hidden state) and way: tokens, drafted, accepted,
acceptance rate and tokens per second (one thread), summed over three images. Greedy output is the
plain output in every row (tests/engine/test_vision_requests.py checks it).
"""

from __future__ import annotations

import argparse
import time

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.runtime import state_batch
from engine.speculative.mtp_images import IMAGE_ROWS
from engine.speculative.settings import SpeculativeSettings
from engine.synth import HeadMap, SynthModel, SynthSpec
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path

IMAGES = (field_png([[RED, GREEN], [BLUE, YELLOW]], width=64, height=64),
          field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32),
          field_png([[BLUE, RED]], width=32, height=32))
MODELS = [("qwen35", "mixed"), ("qwen35moe", "mixed"), ("qwen35", "oracle")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--n-max", type=int, default=3)
    args = parser.parse_args()
    spec = SpeculativeSettings(mode="mtp", n_max=args.n_max)
    print(f"{'model':22} {'image rows':10} {'tokens':>6} {'drafted':>7} {'accepted':>8} {'rate':>5} {'tok/s':>6}")
    for arch, weights in MODELS:
        model = SynthModel(SynthSpec(arch=arch, weights=weights, heads=(HeadMap("hidden", 0.7, 0),), seed=1))
        mmproj = str(projector_path(ProjectorSpec(target=model.spec)))
        with Session(LoadOptions(path=str(model.path("combined")), n_ctx=1024, mmproj=mmproj)) as session:
            assert session.mtp_drafter is not None
            if not state_batch.takes_states(session.mtp_drafter.ctx):
                print("note: this engine was built without patch 0007: exact rows are written as hidden ones")
            for rows in IMAGE_ROWS:
                tokens = drafted = accepted = 0
                seconds = 0.0
                for image in IMAGES:
                    t0 = time.perf_counter()
                    result = generate(session, GenerateRequest(prompt="Look: <__media__> It shows", images=(image,),
                                                               max_tokens=args.tokens, speculative=spec,
                                                               image_rows=rows))
                    seconds += time.perf_counter() - t0
                    tokens, drafted = tokens + len(result.tokens), drafted + result.stats.drafted
                    accepted += result.stats.accepted
                rate = accepted / drafted if drafted else 0.0
                print(f"{arch + ' ' + weights:22} {rows:10} {tokens:6} {drafted:7} {accepted:8} {rate:5.2f} "
                      f"{tokens / seconds:6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the image tests of every API share: the synthetic qwen35 target (its projector and a worker holding
both are the ``vision_files`` and ``vision_link`` fixtures of conftest.py) and two test images."""

from __future__ import annotations

import base64

from engine.synth import SynthSpec
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]])
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)
SPEC = SynthSpec(arch="qwen35", weights="random", seed=1)


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


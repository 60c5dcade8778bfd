"""Synthetic vision projectors load in llama.cpp's mtmd against their qwen35-family targets, and
images made in the test become image rows with their own positions."""

from __future__ import annotations

import pytest

from engine.errors import ImageError, ProjectorError
from engine.runtime import Context, ContextParams, Model, native
from engine.runtime.mtmd import IMAGE, TEXT, Projector
from engine.synth import SynthModel, SynthSpec
from engine.synth.images import BLUE, GREEN, RED, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path, tensors

QUADRANTS = [[RED, GREEN], [BLUE, YELLOW]]


def _target(arch: str) -> SynthSpec:
    return SynthSpec(arch=arch, weights="random", seed=1)


@pytest.fixture(scope="module")
def qwen35() -> object:
    spec = _target("qwen35")
    model = Model(SynthModel(spec).path("combined"), load_mtp=False)
    yield spec, model
    model.close()


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_synthetic_projector_loads_every_tensor_it_holds_against_its_target(arch: str) -> None:
    spec = _target(arch)
    pspec = ProjectorSpec(target=spec)
    path = projector_path(pspec)
    assert path.name.startswith("mmproj-") and path.parent == SynthModel(spec).dir
    with Model(SynthModel(spec).path("combined"), load_mtp=False) as model, Projector(path, model) as projector:
        assert projector.vision and projector.uses_mrope  # qwen35-family targets use M-RoPE (IMROPE)
        loaded = native.recent_log(1, contains="load_tensors: loaded")
        assert loaded and f"loaded {len(tensors(pspec))} tensors" in loaded[0]


def test_an_image_becomes_image_rows_that_advance_fewer_positions_than_cells(qwen35: object) -> None:
    spec, model = qwen35
    projector = Projector(projector_path(ProjectorSpec(target=spec)), model)
    target = Context(model, ContextParams(n_ctx=256))
    try:
        with projector.tokenize(f"Look: {projector.marker} What is it?", [field_png(QUADRANTS)]) as prompt:
            kinds = [c.kind for c in prompt.chunks]
            assert kinds == [TEXT, IMAGE, TEXT]
            image = prompt.chunks[1]
            # 32x32 pixels, 4-pixel patches, 2x2 merged: a 4x4 grid of rows; M-RoPE advances max(4, 4)
            assert (image.n_tokens, image.n_pos) == (16, 4)
            assert prompt.n_tokens - prompt.n_pos == 12
            assert prompt.text_tokens() == [*prompt.chunks[0].tokens, *prompt.chunks[2].tokens]
            edits = target.edits
            assert prompt.decode_image(1, target, 7) == 7 + 4
            assert target.edits > edits  # the prefix cache must not trust this context's old contents
            with pytest.raises(ImageError, match="not an image"):
                prompt.decode_image(0, target, 0)
    finally:
        target.close()
        projector.close()


def test_a_projector_made_for_another_width_is_refused_naming_both_widths(qwen35: object) -> None:
    spec, model = qwen35
    wrong = projector_path(ProjectorSpec(target=spec, projection_dim=48))
    with pytest.raises(ProjectorError, match=r"n_embd = 64\).*n_embd = 48"):
        Projector(wrong, model)


def test_images_that_do_not_decode_or_pair_with_markers_are_refused(qwen35: object) -> None:
    spec, model = qwen35
    with Projector(projector_path(ProjectorSpec(target=spec)), model) as projector:
        image = field_png(QUADRANTS)
        with pytest.raises(ImageError, match="1 image markers for 2 images"):
            projector.tokenize(f"{projector.marker} and", [image, image])
        with pytest.raises(ImageError, match="image 2 .* is not an image"):
            projector.tokenize(f"{projector.marker}{projector.marker}", [image, b"GIF89a but not really"])

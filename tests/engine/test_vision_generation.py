"""Plain decoding after an image: the prompt's text and image rows land where llama.cpp's own mtmd
helper puts them, and the reply is deterministic and depends on the image."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine.errors import ContextError, ImageError
from engine.generation import images as vision
from engine.generation.session import LoadOptions, Session
from engine.runtime import Batch, Context, ContextParams
from engine.synth import SynthModel, SynthSpec
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]])
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def loaded(request: pytest.FixtureRequest) -> object:
    spec = SynthSpec(arch=request.param, weights="random", seed=1)
    session = Session(LoadOptions(path=str(SynthModel(spec).path("combined")), n_ctx=512, mtp=False,
                                  mmproj=str(projector_path(ProjectorSpec(target=spec)))))
    yield session, session.projector
    session.close()


def _reply(loaded: object, image: bytes, max_tokens: int = 12) -> vision.PlainResult:
    session, projector = loaded
    return vision.generate_plain(session, projector, f"Here is a picture: {projector.marker} It shows",
                                 [image], max_tokens=max_tokens)


def test_greedy_reply_after_an_image_is_deterministic_and_depends_on_the_image(loaded: object) -> None:
    first, again, other = _reply(loaded, QUADRANTS), _reply(loaded, QUADRANTS), _reply(loaded, STRIPES)
    assert len(first.tokens) == 12 and first.finish_reason == "length"
    assert again.tokens == first.tokens and again.text == first.text
    assert other.tokens != first.tokens  # the image really reaches the model


def test_the_reply_starts_after_the_images_positions_not_after_its_cells(loaded: object) -> None:
    result = _reply(loaded, STRIPES, max_tokens=2)
    # 48x32 pixels: a 6x4 grid of merged 8-pixel patches, 24 rows advancing max(6, 4) positions
    assert result.prompt.n_cells - result.prompt.n_pos == 24 - 6
    assert result.prompt.n_cells == len(result.prompt.text_tokens) + 24


def test_the_engines_prefill_matches_llama_cpps_own_mtmd_helper(loaded: object) -> None:
    """The reference: mtmd_helper_eval_chunks decodes the same chunks its own way (text batches
    through llama_batch_ext, positions counted by the helper); the last row's logits must agree."""
    from llama_cpp import mtmd_cpp

    session, projector = loaded
    model = session.model
    text = f"One {projector.marker} and two {projector.marker} end"
    ours = Context(model, ContextParams(n_ctx=512, n_batch=8, n_ubatch=8))  # text split over several batches
    theirs = Context(model, ContextParams(n_ctx=512, n_batch=512))
    try:
        with projector.tokenize(text, [QUADRANTS, STRIPES]) as prompt:
            done = vision.prefill(ours, prompt, Batch(ours.n_batch))
            new_n_past = ctypes.c_int32(0)
            rc = mtmd_cpp.mtmd_helper_eval_chunks(projector.handle, theirs.handle, prompt.handle, 0, 0,
                                                  theirs.n_batch, True, ctypes.byref(new_n_past))
            assert rc == 0
        assert done.n_pos == new_n_past.value
        n_vocab = model.n_vocab
        mine = np.ctypeslib.as_array(ours.logits(done.last_row), shape=(n_vocab,)).copy()
        reference = np.ctypeslib.as_array(theirs.logits(-1), shape=(n_vocab,)).copy()
        np.testing.assert_allclose(mine, reference, rtol=1e-4, atol=1e-4)
    finally:
        ours.close()
        theirs.close()


def test_image_parts_of_chat_messages_become_markers_in_prompt_order() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Compare "},
                                     {"type": "image_url", "image_url": {"url": "a"}},
                                     {"type": "text", "text": " with "},
                                     {"type": "image_url", "image_url": {"url": "b"}}]},
    ]
    flat, found = vision.split_image_parts(messages, "<M>", lambda part: part["image_url"]["url"].encode())
    assert flat[0] == messages[0]
    assert flat[1] == {"role": "user", "content": "Compare <M> with <M>"}
    assert found == [b"a", b"b"]
    with pytest.raises(ImageError, match="'audio'"):
        vision.split_image_parts([{"role": "user", "content": [{"type": "audio"}]}], "<M>", lambda p: b"")


def test_a_prompt_with_images_that_does_not_fit_the_context_is_refused(loaded: object) -> None:
    session, projector = loaded
    big = field_png([[RED, BLUE]], width=256, height=256)  # 32x32 rows = 1024 cells
    with pytest.raises(ContextError, match="with its images' rows; the context holds 512"):
        vision.generate_plain(session, projector, f"{projector.marker} ok", [big])


TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"


def _data_url(image: bytes) -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(image).decode()


def test_images_are_read_from_data_urls_and_local_files_only_when_allowed(tmp_path) -> None:
    assert vision.read_image(_data_url(QUADRANTS)) == QUADRANTS
    path = tmp_path / "q.png"
    path.write_bytes(QUADRANTS)
    assert vision.read_image(str(path), allow_files=True) == QUADRANTS
    assert vision.read_image(f"file://{path}", allow_files=True) == QUADRANTS
    with pytest.raises(ImageError, match="local files are not read"):
        vision.read_image(str(path))
    with pytest.raises(ImageError, match="remote images are not fetched"):
        vision.read_image("https://example.com/cat.png", allow_files=True)
    with pytest.raises(ImageError, match="does not decode"):
        vision.read_image("data:image/png;base64,@@@")
    with pytest.raises(ImageError, match="at most 10 are taken"):
        vision.read_image(_data_url(QUADRANTS), max_bytes=10)
    with pytest.raises(ImageError, match="cannot be read"):
        vision.read_image(str(tmp_path / "missing.png"), allow_files=True)


def test_an_openai_image_part_reaches_the_model_through_the_chat_template(loaded: object) -> None:
    session, projector = loaded

    def ask(image: bytes) -> vision.PlainResult:
        messages = [{"role": "user", "content": [{"type": "text", "text": "What is this? "},
                                                 {"type": "image_url", "image_url": {"url": _data_url(image)}}]}]
        prompt = vision.render(session, projector, messages=messages, template=TEMPLATE)
        assert prompt.text == f"<|user|>What is this? {projector.marker}\n<|assistant|>"
        assert prompt.images == (image,) and prompt.mode == "template"
        return vision.generate_plain(session, projector, prompt.text, prompt.images, max_tokens=8,
                                     add_special=prompt.add_special)

    first = ask(QUADRANTS)
    assert ask(QUADRANTS).tokens == first.tokens
    assert ask(STRIPES).tokens != first.tokens


def test_a_generate_request_with_an_image_part_is_answered_plainly(loaded: object) -> None:
    from engine.generation.generator import GenerateRequest, generate

    session, projector = loaded
    messages = ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": _data_url(QUADRANTS)}},
                                             {"type": "text", "text": " Describe it."}]},)
    request = GenerateRequest(messages=messages, template=TEMPLATE, max_tokens=6)
    assert vision.has_images(request) and not vision.has_images(GenerateRequest(prompt="no image"))
    pieces: list[str] = []
    result = generate(session, request, on_text=lambda text, _draft: pieces.append(text))
    assert (len(result.tokens), result.finish_reason, result.stats.generated_tokens) == (6, "length", 6)
    assert "".join(pieces) == result.text and result.stats.drafted == 0
    assert result.stats.prompt_tokens > 16  # the image's 16 rows count among the prompt's cells
    flat = vision.render(session, projector, messages=messages, template=TEMPLATE)
    assert result.tokens == vision.generate_plain(session, projector, flat.text, flat.images, max_tokens=6,
                                                  add_special=flat.add_special).tokens

"""A request with images among others on a multi-sequence session (engine/generation/parallel.py).

Its prompt is decoded into its own sequence as it starts (text and image chunks, the MTP lane catching up on
the image rows exactly), then it decodes with the others. Each request's tokens and, round by round, its
drafts must be what it gives alone; the heads read the hidden state, so a lane fed another sequence's rows,
or image rows at the wrong sequence, would draft differently.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.generation import identity
from engine.generation.generator import GenerateRequest, generate
from engine.generation.parallel import Job, ParallelGenerator, generate_together
from engine.generation.session import LoadOptions, Session
from engine.speculative.settings import SPECULATION_OFF, SpeculativeSettings, mtp
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path
from engine.worker import protocol as P
from tests.engine.test_parallel import same_as_alone

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]])
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)


def files(synth_models: object, arch: str) -> tuple[str, str]:
    model = synth_models(arch, weights="mixed", reads="hidden", seed=1, agree=0.7)  # type: ignore[operator]
    return str(model.path("combined")), str(projector_path(ProjectorSpec(target=model.spec)))


def requests(spec: SpeculativeSettings) -> list[GenerateRequest]:
    """Two text requests around two with images (a different image each, one with two), different lengths."""
    return [
        GenerateRequest(prompt=" the river model", max_tokens=28, speculative=spec, record_drafts=True),
        GenerateRequest(prompt=f"Look at this: {P.IMAGE_MARKER} It shows", images=(QUADRANTS,), max_tokens=24,
                        speculative=spec, record_drafts=True),
        GenerateRequest(prompt=f"First {P.IMAGE_MARKER} then {P.IMAGE_MARKER} and so", images=(STRIPES, QUADRANTS),
                        max_tokens=20, speculative=spec, record_drafts=True),
        GenerateRequest(prompt=" a quiet light", max_tokens=32, speculative=spec, record_drafts=True),
    ]


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("spec", [mtp(3), SPECULATION_OFF], ids=["mtp", "off"])
def test_requests_with_images_decode_beside_others_as_they_would_alone(synth_models, arch, spec):
    path, mmproj = files(synth_models, arch)
    reqs = requests(spec)
    with Session(LoadOptions(path=path, n_ctx=1024 * 4, mmproj=mmproj)) as session:
        solo = [generate(session, replace(r, record_margins=True)) for r in reqs]
        noise = identity.measure_noise(session)
    with Session(LoadOptions(path=path, n_ctx=1024, parallel=4, mmproj=mmproj)) as session:
        # the image requests arrive while the text ones decode
        together = generate_together(session, reqs, starts=[0, 2, 3, 0])
    for s, t in zip(solo, together, strict=True):
        same_as_alone(s, t, noise)
    for t in together[1:3]:
        assert t.stats.prompt_tokens > len(t.tokens) and t.stats.prompt_reused == 0  # image rows counted
        if spec.enabled:
            assert t.stats.settings.mode == "mtp" and t.stats.drafted > 0


def test_a_sequence_that_held_an_image_is_not_reused_as_text(synth_models):
    """After an image its cells do not match its tokens: the next request on that sequence starts empty. An
    image request takes the free sequence holding least, leaving a text prefix for a prompt that may reuse it."""
    path, mmproj = files(synth_models, "qwen35")
    pictured = requests(mtp(2))[1]
    follow = GenerateRequest(prompt=f"Look at this: {P.IMAGE_MARKER} It shows and more", max_tokens=12,
                             speculative=mtp(2))
    with Session(LoadOptions(path=path, n_ctx=1024, mmproj=mmproj)) as session:
        alone = generate(session, replace(follow, prompt=follow.prompt.replace(P.IMAGE_MARKER, "")))
    with Session(LoadOptions(path=path, n_ctx=1024, parallel=2, mmproj=mmproj)) as session:
        engine = ParallelGenerator(session)
        first = Job(pictured)
        engine.add(first)
        while not engine.idle:
            engine.step()
        assert first.result is not None and first.seq == 0
        # sequence 1 (never used, so the one a new prompt takes first) busy: the text takes sequence 0
        busy = Job(GenerateRequest(prompt="Zero hour struck", max_tokens=4, speculative=mtp(2)))
        engine.add(busy)
        text = Job(replace(follow, prompt=follow.prompt.replace(P.IMAGE_MARKER, "")))
        engine.add(text)
        while not engine.idle:
            engine.step()
        assert (busy.seq, text.seq) == (1, 0) and text.result.stats.prompt_reused == 0
        assert text.result.tokens == alone.tokens
        again = Job(replace(follow, prompt=follow.prompt.replace(P.IMAGE_MARKER, "")))
        engine.add(again)  # sequence 0 now holds a text prefix it shares
        image = Job(pictured)
        engine.add(image)
        while not engine.idle:
            engine.step()
    assert again.seq == 0 and again.result.stats.prompt_reused > 0 and again.result.tokens == alone.tokens
    assert image.seq == 1 and image.result.tokens == first.result.tokens


def test_a_request_with_images_without_a_projector_fails_alone(synth_models):
    path, _ = files(synth_models, "qwen35")
    with Session(LoadOptions(path=path, n_ctx=512, parallel=2)) as session:
        engine = ParallelGenerator(session)
        bad, good = Job(requests(mtp(2))[1]), Job(requests(mtp(2))[0])
        engine.add(good)
        engine.add(bad)
        assert bad.done and "projector" in str(bad.error)
        while not engine.idle:
            engine.step()
    assert good.result is not None and good.result.finish_reason in ("length", "stop")
    assert engine.sequences.has_room and len(engine.sequences.free) == 2  # the failed one gave its sequence back


def test_a_prompt_with_images_is_read_a_piece_a_step_while_others_decode(synth_models, monkeypatch):
    """Its text pieces, each image's encode and each image's decode come one a step, and a running reply gets
    its tokens between them: an image request joining does not stall the others for its whole prompt, nor
    for a whole image. Cancelled half-read, it ends and gives its sequence back while the other goes on."""
    from engine.runtime.mtmd import PromptChunks

    seen: list[tuple[str, int]] = []
    encode = PromptChunks.encode_image

    def watched_encode(self: PromptChunks, index: int):  # noqa: ANN202 - the real encode, noted in order
        seen.append(("encode", index))
        return encode(self, index)

    monkeypatch.setattr(PromptChunks, "encode_image", watched_encode)
    path, mmproj = files(synth_models, "qwen35")
    text_req, _, pictured, _ = requests(mtp(2))  # pictured: text, image, text, image, text
    with Session(LoadOptions(path=path, n_ctx=1024, mmproj=mmproj)) as session:
        alone = generate(session, text_req)
        alone_pictured = generate(session, pictured)
    with Session(LoadOptions(path=path, n_ctx=1024, parallel=2, mmproj=mmproj)) as session:
        engine = ParallelGenerator(session)
        seen.clear()
        text = Job(text_req, on_text=lambda t, d: seen.append(("text", 0)))
        engine.add(text)
        engine.step()
        image = Job(pictured, on_prefill=lambda done, total: seen.append(("prefill", done)))
        engine.add(image)
        assert seen[-1] == ("prefill", 0)  # nothing of it decoded yet: that happens in the steps
        while not engine.idle:
            engine.step()
        read = [i for i, (kind, done) in enumerate(seen) if kind == "prefill" and done > 0]
        assert len(read) == 5  # one per piece
        between = [kind for kind, _ in seen[read[0]:read[-1]]]
        assert between.count("text") >= 3  # the running reply went on between the pieces
        encodes = [i for i, (kind, _) in enumerate(seen) if kind == "encode"]
        assert len(encodes) == 2  # one per image
        for e in encodes:  # and between each image's encode and its decode (the prefill after it)
            decoded = next(i for i in read if i > e)
            assert "text" in [kind for kind, _ in seen[e:decoded]]
        assert text.result.tokens == alone.tokens and image.result.tokens == alone_pictured.tokens

        stop: list[bool] = []
        text, image = Job(text_req), Job(pictured, should_stop=lambda: bool(stop))
        engine.add(text)
        engine.add(image)
        engine.step()
        reading = next(r.reading for r in engine.running if r.job is image)
        assert reading is not None and reading.chunks is not None  # half read
        stop.append(True)
        while not engine.idle:
            engine.step()
        assert reading.chunks is None  # the projector's chunks were given back
        assert image.result.finish_reason == "cancelled" and image.result.tokens == []
        assert text.result.tokens == alone.tokens
        assert len(engine.sequences.free) == 2

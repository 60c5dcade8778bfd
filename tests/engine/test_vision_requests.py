"""Images end to end: a generate request with images through generate(), the worker protocol and
`mtp-studio chat --image`, on synthetic qwen35 targets with synthetic projectors."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import ImageError, ProjectorError
from engine.generation import images as vision
from engine.generation.generator import GenerateRequest, generate
from engine.generation.load_plan import LoadPlan
from engine.generation.session import LoadOptions, Session
from engine.speculative.mtp_images import EMBEDDING, EXACT, HIDDEN, IMAGE_ROWS, SKIP
from engine.speculative.settings import SpeculativeSettings
from engine.synth import SynthModel, SynthSpec
from engine.synth.images import BLACK, BLUE, GREEN, RED, WHITE, YELLOW, field_png
from engine.synth.projector import ProjectorSpec, projector_path
from engine.worker import protocol as P
from engine.worker.client import WorkerClient

QUADRANTS = field_png([[RED, GREEN], [BLUE, YELLOW]])
STRIPES = field_png([[BLACK, WHITE, BLACK, WHITE]], width=48, height=32)
SPEC = SynthSpec(arch="qwen35", weights="random", seed=1)
PROMPT = f"Here is a picture: {P.IMAGE_MARKER} It shows"


@pytest.fixture(scope="module")
def files() -> tuple[str, str]:
    return str(SynthModel(SPEC).path("combined")), str(projector_path(ProjectorSpec(target=SPEC)))


@pytest.fixture(scope="module")
def session(files: tuple[str, str]) -> object:
    model, mmproj = files
    with Session(LoadOptions(path=model, n_ctx=512, mmproj=mmproj)) as loaded:
        yield loaded


def _reference(session: Session, image: bytes, max_tokens: int) -> list[int]:
    """The previous helper's plain path, checked against llama.cpp's own mtmd helper."""
    assert session.projector is not None
    return vision.generate_plain(session, session.projector, PROMPT, [image], max_tokens=max_tokens).tokens


def test_a_session_loads_its_projector_and_says_it_takes_images(session: Session, files: tuple[str, str]) -> None:
    facts = session.describe()
    assert facts["vision"] is True and facts["mmproj"] == files[1]
    assert session.projector is not None and session.projector.marker == P.IMAGE_MARKER
    info = P.ModelInfo(**facts)
    assert info.vision and info.mmproj == files[1]


def test_generate_with_images_decodes_like_the_plain_image_path(session: Session) -> None:
    for image in (QUADRANTS, STRIPES):
        result = generate(session, GenerateRequest(prompt=PROMPT, images=(image,), max_tokens=10))
        assert result.tokens == _reference(session, image, 10)
        assert result.finish_reason == "length"
        assert result.stats.prompt_tokens > 16  # the image's rows count among the prompt's cells


def test_ngram_drafting_asked_with_an_image_runs_plainly_and_text_after_it_drafts_again(session: Session) -> None:
    asked = SpeculativeSettings("ngram", 2)
    result = generate(session, GenerateRequest(prompt=PROMPT, images=(QUADRANTS,), max_tokens=10, speculative=asked))
    assert result.tokens == _reference(session, QUADRANTS, 10)
    assert result.stats.settings.mode == "off" and result.stats.drafted == 0
    # the context held image rows the prefix cache cannot describe: the next prompt starts afresh, and drafts
    text = GenerateRequest(prompt="Plain text after", max_tokens=8, speculative=SpeculativeSettings("mtp", 2))
    drafted = generate(session, text)
    assert drafted.stats.settings.mode == "mtp" and drafted.stats.prompt_reused == 0
    assert drafted.tokens == generate(session, GenerateRequest(prompt="Plain text after", max_tokens=8)).tokens


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("rows", IMAGE_ROWS)
def test_greedy_mtp_after_an_image_is_plain_greedy(synth_models: object, arch: str, rows: str) -> None:
    """Each way of writing the image rows into the MTP context, on heads that read the hidden state."""
    model = synth_models(arch, weights="mixed", reads="hidden", agree=0.7, seed=1)
    mmproj = str(projector_path(ProjectorSpec(target=model.spec)))
    with Session(LoadOptions(path=str(model.path("combined")), n_ctx=1024, mmproj=mmproj)) as loaded:
        plain = generate(loaded, GenerateRequest(prompt=PROMPT, images=(QUADRANTS,), max_tokens=32))
        for n_max in (1, 2, 3):
            drafted = generate(loaded, GenerateRequest(prompt=PROMPT, images=(QUADRANTS,), max_tokens=32,
                                                       image_rows=rows, speculative=SpeculativeSettings("mtp", n_max)))
            assert drafted.tokens == plain.tokens, (arch, rows, n_max)
            assert drafted.stats.settings.mode == "mtp" and drafted.stats.drafted > 0


def test_the_image_rows_reach_the_mtp_context(synth_models: object) -> None:
    """Skipping them (llama.cpp's way) and writing them, each way, give the head other states to draft from."""
    model = synth_models("qwen35", weights="random", reads="hidden", seed=1)
    mmproj = str(projector_path(ProjectorSpec(target=model.spec)))
    margins = {}
    with Session(LoadOptions(path=str(model.path("combined")), n_ctx=1024, mmproj=mmproj)) as loaded:
        for rows in IMAGE_ROWS:
            result = generate(loaded, GenerateRequest(prompt=f"Look: {P.IMAGE_MARKER}\n", images=(QUADRANTS,),
                                                      max_tokens=6, image_rows=rows, record_drafts=True,
                                                      speculative=SpeculativeSettings("mtp", 1)))
            margins[rows] = result.draft_margins_per_round
    assert margins[SKIP] != margins[HIDDEN] != margins[EMBEDDING] != margins[SKIP]
    assert margins[EXACT] not in (margins[SKIP], margins[HIDDEN], margins[EMBEDDING])


def test_the_room_left_counts_the_images_cells_not_its_positions(files: tuple[str, str]) -> None:
    model, mmproj = files
    big = field_png([[RED, BLUE]], width=128, height=128)  # 256 rows, 16 positions
    with Session(LoadOptions(path=model, n_ctx=300, mmproj=mmproj, mtp=False)) as small:
        n_ctx = small.target.n_ctx
        result = generate(small, GenerateRequest(prompt=PROMPT, images=(big,), max_tokens=n_ctx))
    # the context is full when its cells are (the positions, 240 fewer, would have let it run on); as after a
    # text prompt, the last token sampled is never decoded
    assert result.finish_reason == "length" and result.stats.prompt_tokens + len(result.tokens) == n_ctx + 1


def test_images_need_a_projector(files: tuple[str, str]) -> None:
    with Session(LoadOptions(path=files[0], n_ctx=256, mtp=False)) as plain:
        assert plain.describe()["vision"] is False
        with pytest.raises(ImageError, match="no vision projector loaded"):
            generate(plain, GenerateRequest(prompt=PROMPT, images=(QUADRANTS,)))


def test_a_projector_that_does_not_fit_the_model_is_refused_before_loading(files: tuple[str, str]) -> None:
    mismatched = projector_path(ProjectorSpec(target=SPEC, projection_dim=48))  # the target takes wider rows
    with pytest.raises(ProjectorError, match="cannot be used with"):
        LoadPlan.read(LoadOptions(path=files[0], mmproj=str(mismatched)))
    with pytest.raises(ProjectorError, match="not a vision projector"):
        LoadPlan.read(LoadOptions(path=files[0], mmproj=files[0]))


def test_the_worker_takes_images_and_says_ngram_drafting_is_off_for_the_reply(session: Session,
                                                                             files: tuple[str, str]) -> None:
    model, mmproj = files
    assert session.projector is not None
    expected = vision.generate_plain(session, session.projector, PROMPT, [QUADRANTS], max_tokens=8)
    with WorkerClient() as worker:
        loaded = worker.call(P.LoadRequest(id="l", options=P.LoadOptions(path=model, n_ctx=512, mmproj=mmproj)))[-1]
        assert isinstance(loaded, P.LoadedEvent) and loaded.model.vision and loaded.model.mmproj == mmproj
        encoded = base64.b64encode(QUADRANTS).decode()
        events = worker.call(P.GenerateRequestMsg(id="g", prompt=PROMPT, images=[encoded], max_tokens=8,
                                                  speculative=SpeculativeSettings("ngram", 2)))
        notices = [e for e in events if isinstance(e, P.ErrorEvent)]
        assert [(e.kind, e.final) for e in notices] == [("speculative_unavailable", False)]
        assert "Only the MTP head drafts after an image" in notices[0].message
        done = events[-1]
        assert isinstance(done, P.DoneEvent) and done.n_tokens == 8 and done.stats.settings.mode == "off"
        assert "".join(e.text for e in events if isinstance(e, P.TokenEvent)) == expected.text
        bad = worker.call(P.GenerateRequestMsg(id="b", prompt=PROMPT, images=["@@"], max_tokens=2))
        assert isinstance(bad[0], P.ErrorEvent) and "not base64" in bad[0].message
        assert isinstance(bad[-1], P.DoneEvent) and bad[-1].finish_reason == "error"


def test_the_chat_command_answers_about_an_image(session: Session, files: tuple[str, str], tmp_path: Path) -> None:
    model, mmproj = files
    image = tmp_path / "cat.png"
    image.write_bytes(QUADRANTS)
    run = subprocess.run([sys.executable, "-m", "engine", "chat", "It shows", "--raw", "--model", model,
                          "--mmproj", mmproj, "--image", str(image), "--mtp", "--max-tokens", "8", "--threads", "1",
                          "--json",
                          "--ctx", "512"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert '"mode": "mtp"' in run.stderr and "speculative_unavailable" not in run.stderr  # MTP drafts after it
    assert session.projector is not None
    reference = vision.generate_plain(session, session.projector, f"{P.IMAGE_MARKER}\nIt shows", [QUADRANTS],
                                      max_tokens=8)
    assert run.stdout.rstrip("\n") == reference.text
    missing = subprocess.run([sys.executable, "-m", "engine", "chat", "x", "--model", model, "--image", str(image)],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "--mmproj" in missing.stderr

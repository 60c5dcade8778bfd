"""Images through the OpenAI API: ``image_url`` parts from the official ``openai`` client, against the real
server and a real worker holding a synthetic qwen35 target with its synthetic projector."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine.generation.generator import GenerateRequest, generate
from engine.generation.session import LoadOptions, Session
from engine.server.engine_link import WorkerLink
from engine.speculative.settings import SPECULATION_OFF
from engine.worker.protocol import IMAGE_MARKER
from tests.server.conftest import MODEL_ID, start_server
from tests.server.test_serve_command import served_address
from tests.server.vision_server import QUADRANTS, STRIPES, data_url

QUESTION = "What is this?"


def ask(client: openai.OpenAI, url: str, **kw: object) -> object:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": f" {QUESTION}"}]
    return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=8, **kw)


@pytest.fixture(scope="module")
def client(vision_link: WorkerLink) -> Iterator[openai.OpenAI]:
    running = start_server(vision_link)
    yield openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
    running.stop()


@pytest.fixture(scope="module")
def expected(vision_files: tuple[str, str]) -> dict[bytes, str]:
    """Each image's greedy reply, generated in this process from the same message with the same image."""
    model, mmproj = vision_files
    messages = ({"role": "user", "content": f"{IMAGE_MARKER} {QUESTION}"},)
    with Session(LoadOptions(path=model, n_ctx=1024, mmproj=mmproj, mtp=False)) as session:
        return {image: generate(session, GenerateRequest(messages=messages, images=(image,), max_tokens=8,
                                                         speculative=SPECULATION_OFF)).text
                for image in (QUADRANTS, STRIPES)}


def test_an_image_url_part_is_answered_as_the_engine_answers_it(client: openai.OpenAI,
                                                               expected: dict[bytes, str]) -> None:
    for image in (QUADRANTS, STRIPES):
        reply = ask(client, data_url(image))
        assert reply.choices[0].message.content == expected[image]
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 8
        assert reply.usage.prompt_tokens > 16  # the image's rows are part of the prompt
        # the server's default is MTP, and the head drafts after the image (the reply is still the plain one)
        report = reply.model_extra["speculative"]
        assert report["mode"] == "mtp" and report["drafted"] > 0 and "note" not in report
    assert expected[QUADRANTS] != expected[STRIPES]  # the image reaches the model
    streamed = ask(client, data_url(QUADRANTS), stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected[QUADRANTS]


def test_remote_urls_and_local_files_are_refused_with_a_clear_400(client: openai.OpenAI, tmp_path: Path) -> None:
    with pytest.raises(openai.BadRequestError, match="remote image URLs are not fetched"):
        ask(client, "https://example.com/cat.png")
    path = tmp_path / "cat.png"
    path.write_bytes(QUADRANTS)
    with pytest.raises(openai.BadRequestError, match="--allow-local-images"):
        ask(client, str(path))
    with pytest.raises(openai.BadRequestError, match="does not decode"):
        ask(client, "data:image/png;base64,@@@")
    with pytest.raises(openai.BadRequestError, match="not an image llama.cpp can read"):
        ask(client, data_url(b"not a picture"))


def test_a_server_allowed_local_images_reads_them(vision_link: WorkerLink, expected: dict[bytes, str],
                                                 tmp_path: Path) -> None:
    path = tmp_path / "cat.png"
    path.write_bytes(STRIPES)
    running = start_server(vision_link, local_images=True)
    try:
        local = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        assert ask(local, str(path)).choices[0].message.content == expected[STRIPES]
        assert ask(local, path.as_uri()).choices[0].message.content == expected[STRIPES]
    finally:
        running.stop()


def test_a_model_without_a_projector_refuses_images_with_a_400(link: WorkerLink) -> None:
    running = start_server(link)
    try:
        plain = openai.OpenAI(base_url=running.base_url, api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError, match="takes no images") as refused:
            ask(plain, data_url(QUADRANTS))
        assert refused.value.body["code"] == "model_not_vision" and "--mmproj" in refused.value.body["message"]
    finally:
        running.stop()


def test_serve_with_a_projector_answers_a_local_image_it_is_allowed_to_read(vision_files: tuple[str, str],
                                                                          expected: dict[bytes, str],
                                                                          tmp_path: Path) -> None:
    path = tmp_path / "cat.png"
    path.write_bytes(QUADRANTS)
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", "--threads", "1", "--model", vision_files[0],
                             "--mmproj", vision_files[1], "--allow-local-images", "--port", "0", "--ctx", "1024",
                             "--speculative", "off"], stderr=subprocess.PIPE, text=True)
    try:
        served = openai.OpenAI(base_url=served_address(proc)[0], api_key="unused", max_retries=0, timeout=120)
        assert ask(served, str(path)).choices[0].message.content == expected[QUADRANTS]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0

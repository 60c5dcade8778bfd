"""Images through the server's other APIs, each from its official client (``anthropic``, ``openai``'s
Responses, ``ollama``) against the real server and a real worker holding the synthetic qwen35 target with
its synthetic projector: the same image and question give, greedy, the reply ``/v1/chat/completions``
gives, and the refusals (a remote URL, a model without a projector) are the chat API's own words."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from engine.server.engine_link import WorkerLink
from tests.server.conftest import MODEL_ID, start_server
from tests.server.vision_server import QUADRANTS, STRIPES, data_url

QUESTION = " What is this?"
N = 8
REMOTE = "https://example.com/cat.png"
# Ollama's own sampling defaults (a repeat penalty among them) would change a greedy reply
OLLAMA_GREEDY = {"temperature": 0, "num_predict": N, "repeat_penalty": 1.0, "top_k": 0, "top_p": 1.0}


def b64(image: bytes) -> str:
    return base64.b64encode(image).decode()


class Clients:
    """The four official clients of one running server."""

    def __init__(self, base_url: str) -> None:
        root = base_url.removesuffix("/v1")
        self.openai = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        self.claude = anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=120)
        self.ollama = ollama.Client(host=root, timeout=120)

    def chat(self, url: str, history: list[dict[str, object]] | None = None) -> str:
        """The reference: the image as an ``image_url`` part of /v1/chat/completions, greedy."""
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": QUESTION}]
        reply = self.openai.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": content}, *(history or [])], temperature=0,
            max_tokens=N)
        return reply.choices[0].message.content

    def anthropic(self, source: dict[str, str], **kw: object) -> str:
        content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
        reply = self.claude.messages.create(model=MODEL_ID, max_tokens=N,
                                            messages=[{"role": "user", "content": content}],
                                            extra_body={"temperature": 0}, **kw)
        return "".join(block.text for block in reply.content if block.type == "text")

    def responses(self, image_url: str, **kw: object) -> openai.types.responses.Response:
        content = [{"type": "input_image", "image_url": image_url, "detail": "auto"},
                   {"type": "input_text", "text": QUESTION}]
        return self.openai.responses.create(model=MODEL_ID, input=[{"role": "user", "content": content}],
                                            temperature=0, max_output_tokens=N, **kw)


@pytest.fixture(scope="module")
def clients(vision_link: WorkerLink) -> Iterator[Clients]:
    running = start_server(vision_link)
    yield Clients(running.base_url)
    running.stop()


@pytest.fixture(scope="module")
def expected(clients: Clients) -> dict[bytes, str]:
    replies = {image: clients.chat(data_url(image)) for image in (QUADRANTS, STRIPES)}
    assert replies[QUADRANTS] != replies[STRIPES]  # the image reaches the model
    return replies


def test_anthropic_image_blocks_are_answered_as_chat_completions_answers_them(clients: Clients,
                                                                            expected: dict[bytes, str]) -> None:
    for image in (QUADRANTS, STRIPES):
        assert clients.anthropic({"type": "base64", "media_type": "image/png", "data": b64(image)}) == expected[image]
        assert clients.anthropic({"type": "url", "url": data_url(image)}) == expected[image]
    content = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(QUADRANTS)}},
               {"type": "text", "text": QUESTION}]
    with clients.claude.messages.stream(model=MODEL_ID, max_tokens=N, messages=[{"role": "user", "content": content}],
                                        extra_body={"temperature": 0}) as stream:
        assert "".join(stream.text_stream) == expected[QUADRANTS]
    counted = clients.claude.messages.count_tokens(model=MODEL_ID, messages=[{"role": "user", "content": content}])
    parts = [{"type": "image_url", "image_url": {"url": data_url(QUADRANTS)}}, {"type": "text", "text": QUESTION}]
    chat = clients.openai.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": parts}],
                                                  max_tokens=1)
    assert counted.input_tokens == chat.usage.prompt_tokens > 16  # the image's rows are part of the prompt


def test_responses_input_images_are_answered_as_chat_completions_answers_them(clients: Clients,
                                                                            expected: dict[bytes, str]) -> None:
    for image in (QUADRANTS, STRIPES):
        assert clients.responses(data_url(image)).output_text == expected[image]
    # a continuation of a kept response sends its image again: the whole conversation through the chat API
    first = clients.responses(data_url(STRIPES))
    more = clients.openai.responses.create(model=MODEL_ID, previous_response_id=first.id, input="And this?",
                                           temperature=0, max_output_tokens=N)
    history = [{"role": "assistant", "content": first.output_text}, {"role": "user", "content": "And this?"}]
    assert more.output_text == clients.chat(data_url(STRIPES), history)


def test_ollama_images_are_answered_as_chat_completions_answers_them(clients: Clients,
                                                                    expected: dict[bytes, str]) -> None:
    for image in (QUADRANTS, STRIPES):
        chat = clients.ollama.chat(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION, "images": [image]}],
                                   options=OLLAMA_GREEDY, stream=False)
        assert chat.message.content == expected[image]
        generated = clients.ollama.generate(model=MODEL_ID, prompt=QUESTION, images=[image], options=OLLAMA_GREEDY,
                                            stream=False)
        assert generated.response == expected[image]
    # Ollama's rule: an image goes in place of the first "[img]" left in the text, else before the text
    placed = clients.ollama.chat(model=MODEL_ID, messages=[{"role": "user", "content": f"[img]{QUESTION}",
                                                            "images": [STRIPES]}], options=OLLAMA_GREEDY, stream=False)
    assert placed.message.content == expected[STRIPES]
    raw = {image: clients.ollama.generate(model=MODEL_ID, prompt=QUESTION, images=[image], raw=True,
                                          options=OLLAMA_GREEDY, stream=False) for image in (QUADRANTS, STRIPES)}
    assert raw[QUADRANTS].eval_count == N and raw[QUADRANTS].response != raw[STRIPES].response
    asked = [{"role": "user", "content": QUESTION, "images": [QUADRANTS]}]
    streamed = clients.ollama.chat(model=MODEL_ID, messages=asked, options=OLLAMA_GREEDY, stream=True)
    assert "".join(part.message.content or "" for part in streamed) == expected[QUADRANTS]
    assert "vision" in clients.ollama.show(MODEL_ID).capabilities


def test_remote_urls_are_refused_in_the_chat_apis_words(clients: Clients) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        clients.chat(REMOTE)
    assert "remote image URLs are not fetched" in chat.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as claude:
        clients.anthropic({"type": "url", "url": REMOTE})
    with pytest.raises(openai.BadRequestError) as responses:
        clients.responses(REMOTE)
    # the same words, but for where in the request the image stood
    words = chat.value.body["message"].split(": ", 1)[1]
    assert claude.value.body["error"]["message"].endswith(words)
    assert responses.value.body["message"].endswith(words)
    with pytest.raises(anthropic.BadRequestError, match="does not decode"):
        clients.anthropic({"type": "base64", "media_type": "image/png", "data": "@@@"})
    with pytest.raises(ollama.ResponseError, match="not an image llama.cpp can read"):
        clients.ollama.chat(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION, "images": [b"no picture"]}],
                            options=OLLAMA_GREEDY, stream=False)


def test_local_files_are_read_only_where_the_server_allows_them(vision_link: WorkerLink, clients: Clients,
                                                              expected: dict[bytes, str], tmp_path: Path) -> None:
    path = tmp_path / "cat.png"
    path.write_bytes(STRIPES)
    with pytest.raises(anthropic.BadRequestError, match="--allow-local-images"):
        clients.anthropic({"type": "url", "url": str(path)})
    with pytest.raises(openai.BadRequestError, match="--allow-local-images"):
        clients.responses(str(path))
    running = start_server(vision_link, local_images=True)
    try:
        local = Clients(running.base_url)
        assert local.anthropic({"type": "url", "url": path.as_uri()}) == expected[STRIPES]
        assert local.responses(str(path)).output_text == expected[STRIPES]
    finally:
        running.stop()


def test_a_model_without_a_projector_refuses_images_in_every_api(link: WorkerLink) -> None:
    running = start_server(link)
    try:
        plain = Clients(running.base_url)
        with pytest.raises(openai.BadRequestError) as chat:
            plain.chat(data_url(QUADRANTS))
        words = chat.value.body["message"]
        assert "takes no images" in words and "--mmproj" in words
        with pytest.raises(anthropic.BadRequestError) as claude:
            plain.anthropic({"type": "base64", "media_type": "image/png", "data": b64(QUADRANTS)})
        assert claude.value.body["error"]["message"] == words
        with pytest.raises(openai.BadRequestError) as responses:
            plain.responses(data_url(QUADRANTS))
        assert responses.value.body["message"] == words and responses.value.body["code"] == "model_not_vision"
        with pytest.raises(ollama.ResponseError) as chatted:
            plain.ollama.chat(model=MODEL_ID, messages=[{"role": "user", "content": QUESTION, "images": [QUADRANTS]}],
                              stream=False)
        assert chatted.value.status_code == 400 and chatted.value.error == words
        with pytest.raises(ollama.ResponseError) as generated:
            plain.ollama.generate(model=MODEL_ID, prompt=QUESTION, images=[QUADRANTS], stream=False)
        assert generated.value.status_code == 400 and generated.value.error == words
        assert "vision" not in plain.ollama.show(MODEL_ID).capabilities
    finally:
        running.stop()

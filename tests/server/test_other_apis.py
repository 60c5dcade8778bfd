"""The official ``anthropic``, ``ollama`` and ``openai`` (Responses) clients against the
real server, a real worker and the synthetic MTP model: the same engine answers every API, so a greedy reply
is the same text through each, and each client's own types, stream parsers and errors accept the answers.
"""

from __future__ import annotations

import anthropic
import httpx
import ollama
import openai
import pytest

from tests.server.conftest import MODEL_ID, start_server

PROMPT = "hello world the"
MESSAGES = [{"role": "user", "content": PROMPT}]
GREEDY = {"temperature": 0}  # the anthropic client (2.x) takes no temperature argument; the API does


def root(server) -> str:
    return server.base_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def openai_client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=root(server), api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ollama_client(server):
    return ollama.Client(host=root(server), timeout=120)


@pytest.fixture(scope="module")
def greedy(openai_client) -> tuple[str, int]:
    """The reference: 24 greedy tokens through the OpenAI chat endpoint, and the prompt's token count."""
    reply = openai_client.chat.completions.create(model=MODEL_ID, messages=MESSAGES, max_tokens=24, temperature=0)
    assert reply.choices[0].finish_reason == "length"
    return reply.choices[0].message.content, reply.usage.prompt_tokens


# -- Anthropic Messages ---------------------------------------------------------------------------------
def test_anthropic_greedy_reply_matches_openai_chat_and_its_usage_adds_up(claude, greedy):
    text, prompt_tokens = greedy
    message = claude.messages.create(model="claude-sonnet-4-5", max_tokens=24, messages=MESSAGES, extra_body=GREEDY)
    assert isinstance(message, anthropic.types.Message) and message.model == MODEL_ID
    assert message.content[0].text == text and message.stop_reason == "max_tokens"
    usage = message.usage
    assert usage.output_tokens == 24
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == prompt_tokens


def test_anthropic_stream_gives_the_same_text_and_counts(claude, greedy):
    text, _ = greedy
    with claude.messages.stream(model="claude-haiku-4-5", max_tokens=24, messages=MESSAGES,
                                extra_body=GREEDY) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text == final.content[0].text and len(pieces) > 1
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 24


def test_anthropic_count_tokens_counts_the_prompt_the_reply_used(claude, greedy):
    _, prompt_tokens = greedy
    counted = claude.messages.count_tokens(model="claude-x", messages=MESSAGES)
    assert counted.input_tokens == prompt_tokens


def test_anthropic_system_prompt_and_stop_sequences(claude, greedy):
    text, _ = greedy
    words = text.split()
    stop = words[3]
    message = claude.messages.create(model="m", max_tokens=24, messages=MESSAGES, extra_body=GREEDY,
                                     stop_sequences=[stop, "never-appears"])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert stop not in message.content[0].text
    with_system = claude.messages.create(model="m", max_tokens=4, messages=MESSAGES, extra_body=GREEDY,
                                         system="You are terse.")
    assert with_system.usage.input_tokens + (with_system.usage.cache_read_input_tokens or 0) > 0


def test_anthropic_refusals_and_errors_in_anthropics_shape(claude):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", max_tokens=4, messages=MESSAGES, extra_body={"temperature": 9})


def test_anthropic_key_goes_in_x_api_key(link):
    keyed = start_server(link, api_key="sk-test-123")
    try:
        good = anthropic.Anthropic(base_url=root(keyed), api_key="sk-test-123", max_retries=0, timeout=120)
        assert good.messages.create(model="m", max_tokens=2, messages=MESSAGES).content
        bad = anthropic.Anthropic(base_url=root(keyed), api_key="wrong", max_retries=0, timeout=120)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            bad.messages.create(model="m", max_tokens=2, messages=MESSAGES)
        assert refused.value.body["error"]["type"] == "authentication_error"
    finally:
        keyed.stop()


# -- OpenAI Responses -------------------------------------------------------------------------------------
def test_responses_greedy_reply_matches_openai_chat(openai_client, greedy):
    text, prompt_tokens = greedy
    response = openai_client.responses.create(model="gpt-5-codex", input=MESSAGES, max_output_tokens=24,
                                              temperature=0)
    assert response.output_text == text and response.model == MODEL_ID
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == prompt_tokens and response.usage.output_tokens == 24


def test_responses_stream_gives_the_same_text(openai_client, greedy):
    text, _ = greedy
    events = list(openai_client.responses.create(model="m", input=MESSAGES, max_output_tokens=24, temperature=0,
                                                 stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    final = events[-1]  # cut by max_output_tokens: the stream ends as OpenAI's does, "response.incomplete"
    assert final.type == "response.incomplete" and final.response.incomplete_details.reason == "max_output_tokens"
    assert "".join(deltas) == text == final.response.output_text and len(deltas) > 1


def test_responses_instructions_are_a_system_message(openai_client):
    with_instructions = openai_client.responses.create(model="m", input=PROMPT, instructions="Be terse.",
                                                       max_output_tokens=2, temperature=0)
    plain = openai_client.responses.create(model="m", input=PROMPT, max_output_tokens=2, temperature=0)
    assert with_instructions.usage.input_tokens > plain.usage.input_tokens
    assert with_instructions.instructions == "Be terse."


def test_responses_continue_a_kept_response_as_if_the_conversation_were_sent(openai_client):
    first = openai_client.responses.create(model="m", input=PROMPT, instructions="Be terse.", max_output_tokens=4,
                                           temperature=0)
    continued = openai_client.responses.create(model="m", previous_response_id=first.id, input="more",
                                               max_output_tokens=4, temperature=0)
    whole = openai_client.responses.create(model="m", max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "more"}])  # instructions are not inherited, as OpenAI's are not
    assert continued.output_text == whole.output_text and continued.usage.input_tokens == whole.usage.input_tokens
    streamed = list(openai_client.responses.create(model="m", input=PROMPT, max_output_tokens=4, temperature=0,
                                                   stream=True))[-1].response
    after_stream = openai_client.responses.create(model="m", previous_response_id=streamed.id, input="more",
                                                  max_output_tokens=4, temperature=0)
    assert after_stream.usage.input_tokens == whole.usage.input_tokens
    unkept = openai_client.responses.create(model="m", input=PROMPT, max_output_tokens=2, store=False)
    for gone in (unkept.id, "resp_123"):
        with pytest.raises(openai.NotFoundError) as refused:
            openai_client.responses.create(model="m", input="again", previous_response_id=gone)
        assert refused.value.body["param"] == "previous_response_id"


# -- Ollama -------------------------------------------------------------------------------------------------
def test_ollama_chat_greedy_reply_matches_openai_chat(ollama_client, greedy):
    text, prompt_tokens = greedy
    reply = ollama_client.chat(model=MODEL_ID, messages=MESSAGES, stream=False,
                               options={"temperature": 0, "num_predict": 24, "repeat_penalty": 1.0})
    assert reply.message.content == text and reply.done and reply.done_reason == "length"
    assert reply.eval_count == 24 and reply.prompt_eval_count == prompt_tokens
    assert reply.eval_duration > 0 and reply.total_duration >= reply.eval_duration


def test_ollama_chat_streams_ndjson(ollama_client, server, greedy):
    text, _ = greedy
    parts = list(ollama_client.chat(model=MODEL_ID, messages=MESSAGES, stream=True,
                                    options={"temperature": 0, "num_predict": 24, "repeat_penalty": 1.0}))
    assert "".join(p.message.content for p in parts) == text and len(parts) > 2
    assert parts[-1].done and parts[-1].eval_count == 24
    raw = httpx.post(f"{root(server)}/api/chat", timeout=120,
                     json={"model": MODEL_ID, "messages": MESSAGES, "options": {"num_predict": 3}})
    assert raw.headers["content-type"].startswith("application/x-ndjson")  # Ollama streams unless told not to
    assert raw.text.count("\n") >= 2


def test_ollama_generate_and_load_check(ollama_client):
    answer = ollama_client.generate(model=MODEL_ID, prompt=PROMPT, raw=True, stream=False,
                                    options={"temperature": 0, "num_predict": 8})
    assert answer.response and answer.done and answer.eval_count == 8
    loaded = ollama_client.generate(model=MODEL_ID)
    assert loaded.done and loaded.done_reason == "load"


def test_ollama_model_facts(ollama_client, server):
    (listed,) = ollama_client.list().models
    assert listed.model == MODEL_ID and listed.size > 0 and listed.details.format == "gguf"
    shown = ollama_client.show(MODEL_ID)
    arch = shown.modelinfo["general.architecture"]
    assert shown.modelinfo[f"{arch}.context_length"] == 8192 and "completion" in shown.capabilities
    version = httpx.get(f"{root(server)}/api/version", timeout=30).json()["version"]
    assert tuple(int(x) for x in version.split(".")) >= (0, 6, 4)  # VS Code Copilot's minimum


def test_ollama_errors(ollama_client):
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.generate(model=MODEL_ID, prompt="x", suffix="y", stream=False)
    assert refused.value.status_code == 400 and "suffix" in refused.value.error

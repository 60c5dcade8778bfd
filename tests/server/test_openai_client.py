"""The official ``openai`` package against the real server, a real worker and a
synthetic MTP model: what a client sees, and that it matches the engine."""

from __future__ import annotations

import subprocess
import sys

import httpx
import openai
import pytest

from tests.server.conftest import MODEL_ID, start_server

PROMPT = "hello world the"


def chat(client: openai.OpenAI, **kw: object) -> object:
    return client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": PROMPT}], **kw)


def test_models_lists_the_loaded_model_with_its_mtp_heads(openai_client):
    models = openai_client.models.list().data
    assert [m.id for m in models] == [MODEL_ID]
    assert models[0].meta["mtp"] == "single" and models[0].meta["speculative_default"]["mode"] == "mtp"
    assert openai_client.models.retrieve(MODEL_ID).id == MODEL_ID
    with pytest.raises(openai.NotFoundError):
        openai_client.models.retrieve("gpt-4o")


def test_chat_stream_and_whole_reply_agree_and_usage_counts_the_streamed_tokens(openai_client):
    whole = chat(openai_client, max_tokens=24, temperature=0)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 24 and whole.usage.prompt_tokens > 0
    chunks = list(chat(openai_client, max_tokens=24, temperature=0, stream=True,
                       stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 24 == len(pieces)
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_and_not(openai_client):
    whole = openai_client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=12, temperature=0)
    streamed = openai_client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=12, temperature=0,
                                                stream=True)
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text != ""
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"


def test_timings_carry_the_draft_counts_so_a_client_sees_mtp_working(openai_client):
    reply = chat(openai_client, max_tokens=32, temperature=0)
    timings, spec = reply.model_extra["timings"], reply.model_extra["speculative"]
    assert timings["predicted_n"] == 32 and timings["prompt_n"] + timings["cache_n"] == reply.usage.prompt_tokens
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert spec["mode"] == "mtp" and spec["drafted"] == timings["draft_n"] and len(spec["acceptance_per_pos"]) == 3


def test_speculative_extension_turns_mtp_off_per_request_with_the_same_greedy_text(openai_client):
    with_mtp = chat(openai_client, max_tokens=40, temperature=0)
    plain = chat(openai_client, max_tokens=40, temperature=0, extra_body={"speculative": "off"})
    assert plain.model_extra["timings"]["draft_n"] == 0 and plain.model_extra["speculative"]["mode"] == "off"
    deeper = chat(openai_client, max_tokens=40, temperature=0, extra_body={"speculative": {"mode": "mtp", "n_max": 5}})
    assert deeper.model_extra["speculative"]["n_max"] == 5
    assert with_mtp.choices[0].message.content == plain.choices[0].message.content \
        == deeper.choices[0].message.content


def test_stop_string_ends_the_reply_before_it(openai_client):
    words = chat(openai_client, max_tokens=20, temperature=0).choices[0].message.content.split()
    stop = words[5]
    reply = chat(openai_client, max_tokens=20, temperature=0, stop=[stop, "never-appears"])
    assert reply.choices[0].finish_reason == "stop"
    text = reply.choices[0].message.content
    assert stop not in text and text.split() == words[:words.index(stop)]


def test_seed_makes_sampling_repeat(openai_client):
    def sample(seed: int) -> str:
        return chat(openai_client, max_tokens=30, temperature=1.5, seed=seed).choices[0].message.content

    first = sample(7)
    assert sample(7) == first
    assert any(sample(seed) != first for seed in (8, 9, 10))


def test_greedy_reply_is_identical_to_mtp_studio_chat(openai_client, model_path):
    cli = subprocess.run([sys.executable, "-m", "engine", "chat", PROMPT, "--model", model_path, "--mtp",
                          "--max-tokens", "48", "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    reply = chat(openai_client, max_tokens=48, temperature=0)
    assert reply.choices[0].message.content == cli.stdout.removesuffix("\n")


@pytest.mark.parametrize(("kw", "param"), [
    ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"n": 9}, "n"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"logit_bias": {"12": 200}}, "logit_bias"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"seed": -1}, "seed"),
    ({"extra_body": {"speculative": {"mode": "mtp", "n_max": 99}}}, "speculative"),
    ({"extra_body": {"mirostat": 2}}, "mirostat"),
])
def test_bad_or_unsupported_parameters_are_400s_naming_the_parameter(openai_client, kw, param):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(openai_client, **{"max_tokens": 4, **kw})
    assert caught.value.status_code == 400 and caught.value.body["param"] == param
    assert param in caught.value.body["message"]


def test_any_model_name_is_served_by_the_loaded_model_unless_strict(openai_client, link):
    # clients send what their user typed or a default; the answer names the model that ran
    reply = openai_client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2)
    assert reply.model == MODEL_ID
    strict = start_server(link, strict_model=True)
    try:
        client = openai.OpenAI(base_url=strict.base_url, api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert caught.value.body["code"] == "model_not_found" and MODEL_ID in caught.value.body["message"]
    finally:
        strict.stop()


def test_bad_json_and_oversized_bodies_get_openai_style_errors(server):
    url = f"{server.base_url}/chat/completions"
    bad = httpx.post(url, content=b'{"model": ', headers={"Content-Type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_json"
    big = httpx.post(url, content=b"x" * (server.config.max_body_bytes + 1),
                     headers={"Content-Type": "application/json"})
    assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"


def test_health_and_prometheus_metrics(server, openai_client):
    chat(openai_client, max_tokens=8, temperature=0)
    assert httpx.get(server.base_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["llamacpp:tokens_predicted_total"] >= 8 and values["llamacpp:prompt_tokens_total"] > 0
    assert values["mtpstudio:draft_tokens_accepted_total"] > 0
    assert values['mtpstudio:draft_tokens_per_position_total{position="1"}'] > 0
    assert 0 < values['mtpstudio:draft_acceptance_per_position{position="1"}'] <= 1
    assert values["llamacpp:requests_processing"] == 0


def test_max_completion_tokens_and_roles(openai_client):
    reply = openai_client.chat.completions.create(
        model=MODEL_ID, max_completion_tokens=5, temperature=0,
        messages=[{"role": "developer", "content": "Be brief."}, {"role": "user", "content": PROMPT},
                  {"role": "assistant", "content": "river"}, {"role": "user", "content": [{"type": "text",
                                                                                          "text": "more"}]}])
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "1", "function": {"name": "f"}}]}]},
     "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": [1]}, "stop"),
])
def test_malformed_chat_bodies_are_400s_naming_the_field(server, body, param):
    answer = httpx.post(f"{server.base_url}/chat/completions", json={"model": MODEL_ID, **body}, timeout=30)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param


def test_completions_refuse_what_they_cannot_honour(openai_client):
    for kw, param in (({"prompt": ["a", "b"]}, "prompt"), ({"prompt": "a", "echo": True}, "echo"),
                      ({"prompt": "a", "best_of": 2}, "best_of")):
        with pytest.raises(openai.BadRequestError) as caught:
            openai_client.completions.create(model=MODEL_ID, max_tokens=2, **kw)
        assert caught.value.body["param"] == param


def test_a_prompt_longer_than_the_context_is_a_400(openai_client):
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.completions.create(model=MODEL_ID, prompt="river valley " * 6000, max_tokens=4)
    assert caught.value.body["code"] == "context_length_exceeded" and "context" in caught.value.body["message"]
    assert openai_client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=2).usage.completion_tokens == 2

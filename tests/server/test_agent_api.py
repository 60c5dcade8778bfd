"""What coding agents and structured-output libraries ask of the server, through
the official ``openai`` client on loopback: tool calls (with a real agent
loop), JSON schemas, logprobs, ``n``, ``logit_bias``, and llama-server's
compatibility details. Every feature is also run with MTP off: greedy output
must be the same tokens either way.

The model is the synthetic glm4moe MTP model. It has no chat template, so
tools are rendered with the generic ChatML template and Hermes-style calls;
``tool_choice: "required"`` makes even this model call a tool (a grammar
allows exactly one well-formed call).
"""

from __future__ import annotations

import json

import httpx
import openai
import pydantic

from tests.server.conftest import MODEL_ID

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                                       "properties": {"zone": {"enum": ["UTC", "CET"]}}}}}
OFF = {"speculative": "off"}
MTP = {"speculative": {"mode": "mtp", "n_max": 3}}


def ask(client: openai.OpenAI, messages: list, spec: dict, **kw: object) -> object:
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=MODEL_ID, messages=messages, extra_body=spec, **kw)


def test_an_agent_loop_calls_a_tool_gets_the_result_and_answers_with_mtp_as_without(openai_client):
    question = [{"role": "system", "content": "You are a weather bot."},
                {"role": "user", "content": "What is the weather in Paris?"}]
    turns = {}
    for name, spec in (("off", OFF), ("mtp", MTP)):
        first = ask(openai_client, question, spec, tools=[WEATHER, TIME], tool_choice="required", max_tokens=80)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content in (None, "")
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name in ("get_weather", "get_time") and call.id
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments, dict)
        history = [*question, choice.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 14, "sky": "rain"})}]
        final = ask(openai_client, history, spec, tools=[WEATHER, TIME], max_tokens=24)
        assert final.choices[0].message.content and final.usage.prompt_tokens > first.usage.prompt_tokens
        turns[name] = (call.function.name, arguments, final.choices[0].message.content)
        if name == "mtp":
            assert first.model_extra["timings"]["draft_n"] > 0  # the call itself was drafted and verified
    assert turns["mtp"] == turns["off"]


def test_a_named_tool_choice_calls_that_tool_and_streams_the_call(openai_client):
    named = {"type": "function", "function": {"name": "get_time"}}
    whole = ask(openai_client, [{"role": "user", "content": "time?"}], MTP, tools=[WEATHER, TIME],
                tool_choice=named, max_tokens=120)
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_time" and json.loads(call.function.arguments)["zone"] in ("UTC", "CET")
    chunks = list(ask(openai_client, [{"role": "user", "content": "time?"}], MTP, tools=[WEATHER, TIME],
                      tool_choice=named, max_tokens=120, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    assert calls[0].function.arguments == call.function.arguments
    assert "<tool_call>" not in "".join(d.content or "" for d in deltas)  # markup never shows as text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_tool_choice_none_offers_no_tools(openai_client):
    plain = ask(openai_client, [{"role": "user", "content": "hi"}], OFF, max_tokens=8)
    none = ask(openai_client, [{"role": "user", "content": "hi"}], OFF, max_tokens=8, tools=[WEATHER],
               tool_choice="none")
    assert none.choices[0].message.content == plain.choices[0].message.content
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(json_schema_extra={"enum": ["Paris", "Oslo"]})
    rain: bool
    hours: list[int] = pydantic.Field(min_length=3, max_length=3)


def test_structured_output_parses_into_the_clients_model_and_mtp_keeps_it(openai_client):
    answers = {}
    for name, spec in (("off", OFF), ("mtp", MTP)):
        parsed = openai_client.chat.completions.parse(
            model=MODEL_ID, messages=[{"role": "user", "content": "Forecast?"}], response_format=Forecast,
            temperature=0, max_tokens=200, extra_body=spec)
        forecast = parsed.choices[0].message.parsed
        assert isinstance(forecast, Forecast) and forecast.city in ("Paris", "Oslo") and len(forecast.hours) == 3
        answers[name] = parsed.choices[0].message.content
    assert answers["mtp"] == answers["off"]


def test_json_mode_and_llama_server_grammar(openai_client, server):
    reply = ask(openai_client, [{"role": "user", "content": "json"}], MTP, max_tokens=40,
                response_format={"type": "json_object"})
    assert reply.choices[0].message.content.startswith("{")
    grammar = 'root ::= "yes" | "no"'
    answer = httpx.post(f"{server.base_url}/completions", timeout=60,
                        json={"prompt": "ok?", "grammar": grammar, "max_tokens": 8, "temperature": 0})
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"] in ("yes", "no")
    broken = httpx.post(f"{server.base_url}/completions", timeout=60,
                        json={"prompt": "ok?", "grammar": 'root ::= "yes', "max_tokens": 8})
    assert broken.status_code == 400 and broken.json()["error"]["code"] == "invalid_grammar"
    unsupported = httpx.post(f"{server.base_url}/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "https://x"}}}})
    assert unsupported.status_code == 400 and unsupported.json()["error"]["param"] == "response_format"


def test_logprobs_are_the_targets_and_the_same_with_and_without_mtp(openai_client):
    runs = {name: ask(openai_client, [{"role": "user", "content": "hello world"}], spec, max_tokens=12,
                      logprobs=True, top_logprobs=2) for name, spec in (("off", OFF), ("mtp", MTP))}
    off, mtp = (runs[k].choices[0].logprobs.content for k in ("off", "mtp"))
    assert len(off) == len(mtp) == runs["off"].usage.completion_tokens
    assert "".join(t.token for t in off) == runs["off"].choices[0].message.content
    for a, b in zip(off, mtp, strict=True):
        assert a.token == b.token and len(a.top_logprobs) == 2 and a.top_logprobs[0].token == a.token
        assert abs(a.logprob - b.logprob) < 1e-2
    chunks = list(ask(openai_client, [{"role": "user", "content": "hello world"}], MTP, max_tokens=12, logprobs=True,
                      top_logprobs=2, stream=True))
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in mtp]  # each chunk its own
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices and not c.choices[0].delta.content)
    legacy = openai_client.completions.create(model=MODEL_ID, prompt="hello world", max_tokens=6, temperature=0,
                                              logprobs=2)
    assert len(legacy.choices[0].logprobs.tokens) == 6 and len(legacy.choices[0].logprobs.top_logprobs[0]) == 2


def test_n_choices_and_logit_bias(openai_client):
    two = ask(openai_client, [{"role": "user", "content": "hello"}], MTP, max_tokens=6, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].message.content == two.choices[1].message.content  # greedy: the same twice
    assert two.usage.completion_tokens == 12
    sampled = ask(openai_client, [{"role": "user", "content": "hello"}], MTP, max_tokens=12, n=3,
                  temperature=1.0, seed=4)
    assert len({c.message.content for c in sampled.choices}) > 1  # each choice draws on its own
    root = str(openai_client.base_url).removesuffix("/v1/")

    def piece(token: int) -> str:
        return httpx.post(f"{root}/detokenize", json={"tokens": [token]}, timeout=30).json()["content"]

    boosted = openai_client.completions.create(model=MODEL_ID, prompt="hello", max_tokens=4, temperature=0,
                                               logit_bias={"300": 100, "301": 90})
    assert boosted.choices[0].text == piece(300) * 4
    banned = openai_client.completions.create(model=MODEL_ID, prompt="hello", max_tokens=4, temperature=0,
                                              logit_bias={"300": -100, "301": 90})
    assert banned.choices[0].text == piece(301) * 4


def test_llama_server_compatibility_details(server, openai_client):
    root = server.base_url.removesuffix("/v1")
    assert httpx.get(f"{root}/models").json()["data"][0]["id"] == MODEL_ID
    body = {"messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4, "temperature": 0,
            "cache_prompt": True, "id_slot": 0, "timings_per_token": False, "typical_p": 1.0, "n_keep": 0}
    first = httpx.post(f"{root}/chat/completions", json=body, timeout=60).json()  # no model, no /v1
    assert first["model"] == MODEL_ID and first["system_fingerprint"].startswith("mtp-studio-")
    again = httpx.post(f"{root}/chat/completions", json=body, timeout=60).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == again["timings"]["cache_n"] > 0
    refused = httpx.post(f"{root}/chat/completions", json={**body, "typical_p": 0.5}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "typical_p"
    tokens = httpx.post(f"{root}/tokenize", json={"content": "hello world", "with_pieces": True}, timeout=30).json()
    assert "".join(p["piece"] for p in tokens["tokens"]).endswith("hello world")
    ids = [p["id"] for p in tokens["tokens"]]
    assert httpx.post(f"{root}/detokenize", json={"tokens": ids}, timeout=30).json()["content"].endswith(
        "hello world")

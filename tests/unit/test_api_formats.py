"""The Anthropic Messages, Ollama and OpenAI Responses translations (``engine/server/*_format.py``),
proven against the official client libraries without a server: each client talks to an
``httpx.MockTransport`` that does what a route does (parse the body the client built, answer with the
module's body or stream for a scripted :class:`Reply`), so the client's own request builder, response
types, stream parsers and accumulators judge every byte. Plus the rules no client exercises."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from engine.sampling import RANDOM_SEED
from engine.server import anthropic_format as A
from engine.server import ollama_format as O
from engine.server import responses_format as R
from engine.server.openai_format import ApiError, ParsedRequest
from engine.server.reply import Reply, TokenLogprob, ToolCall
from engine.server.response_store import ResponseStore
from engine.worker.protocol import IMAGE_MARKER

MODEL = "synth-glm4moe"
SERVED = (MODEL, f"{MODEL}.gguf")
N_CTX = 4096
BASE = "http://mtp.test"
TIMINGS = {"prompt_n": 10, "prompt_ms": 12.5, "predicted_n": 5, "predicted_ms": 250.0, "cache_n": 2}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def make_reply(content: str = "", *, calls: tuple[ToolCall, ...] = (), finish: str = "stop", prompt: int = 12,
               completion: int = 5, cached: int = 0, **kw: Any) -> Reply:
    return Reply(model=MODEL, content=content, tool_calls=calls, finish=finish, prompt_tokens=prompt,
                 completion_tokens=completion, cached_tokens=cached, **kw)


def pieces(text: str, size: int = 3) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


Answer = Callable[[ParsedRequest], Reply]


def _json(request: Any) -> Any:
    return json.loads(request.content) if request.content else None


# -- the three "routes", as app.py will wire them ---------------------------------------------------
def anthropic_route(answer: Answer, seen: list[ParsedRequest], *, strict: bool = False, http: Any = httpx) -> Any:
    def handle(request: Any) -> Any:
        try:
            parsed = A.parse(_json(request), SERVED, N_CTX, strict_model=strict)
        except ApiError as err:
            return http.Response(err.status, json=A.error_body(err))
        seen.append(parsed)
        if request.url.path.endswith("/count_tokens"):
            return http.Response(200, json=A.count_tokens_body(21))
        reply = answer(parsed)
        if not parsed.stream:
            return http.Response(200, json=A.response(reply))
        stream = A.Stream(reply.model, input_tokens=reply.prompt_tokens, cached_tokens=reply.cached_tokens)
        events = stream.start()
        for piece in pieces(reply.content):
            events += stream.text(piece)
        events += stream.error(reply.extras["fail"]) if "fail" in reply.extras else stream.finish(reply)
        return http.Response(200, headers={"content-type": "text/event-stream"}, content="".join(events).encode())
    return http.MockTransport(handle)


def ollama_route(answer: Answer, seen: list[Any], *, strict: bool = False, http: Any = httpx) -> Any:
    facts = {"path": "/models/synth.gguf", "size": 123_456_789, "modified": 1_700_000_000.0,
             "architecture": "glm4moe", "n_params": 268_100_000, "quantization": "Q4_K_M"}

    def handle(request: Any) -> Any:
        path = request.url.path
        try:
            if path == "/api/tags":
                return http.Response(200, json=O.tags_body(MODEL, **facts))
            if path == "/api/ps":
                return http.Response(200, json=O.ps_body(MODEL, n_ctx=N_CTX, **facts))
            if path == "/api/version":
                return http.Response(200, json=O.version_body())
            if path == "/api/show":
                O.parse_show(_json(request), SERVED, strict_model=strict)
                return http.Response(200, json=O.show_body(
                    architecture="glm4moe", n_ctx=N_CTX, n_params=facts["n_params"], quantization="Q4_K_M",
                    modified=facts["modified"], template="{{ .Prompt }}"))
            chat = path == "/api/chat"
            parse = O.parse_chat if chat else O.parse_generate
            parsed = parse(_json(request), SERVED, N_CTX, strict_model=strict)
        except ApiError as err:
            return http.Response(err.status, json=O.error_body(err))
        seen.append(parsed)
        if isinstance(parsed, O.LoadCheck):
            return http.Response(200, json=O.load_body(parsed))
        reply = answer(parsed)
        if not parsed.stream:
            return http.Response(200, json=O.response(reply, chat=chat))
        stream = O.Stream(reply.model, chat=chat)
        lines = stream.start()
        for piece in pieces(reply.content):
            lines += stream.text(piece)
        lines += stream.error(reply.extras["fail"]) if "fail" in reply.extras else stream.finish(reply)
        return http.Response(200, headers={"content-type": "application/x-ndjson"}, content="".join(lines).encode())
    return http.MockTransport(handle)


def responses_route(answer: Answer, seen: list[ParsedRequest], *, strict: bool = False, http: Any = httpx) -> Any:
    def handle(request: Any) -> Any:
        body = _json(request)
        try:
            parsed = R.parse(body, SERVED, N_CTX, strict_model=strict)
        except ApiError as err:
            return http.Response(err.status, json=R.error_body(err))
        seen.append(parsed)
        reply = answer(parsed)
        if not parsed.stream:
            return http.Response(200, json=R.response(reply, body))
        stream = R.Stream(reply.model, body)
        events = stream.start()
        for piece in pieces(reply.content):
            events += stream.text(piece)
        events += stream.error(reply.extras["fail"]) if "fail" in reply.extras else stream.finish(reply)
        return http.Response(200, headers={"content-type": "text/event-stream"}, content="".join(events).encode())
    return http.MockTransport(handle)


def sdk_http(sdk: Any) -> Any:
    """The HTTP package an official SDK is built on (``httpx``, or ``httpx2`` in newer releases)."""
    base = importlib.import_module(f"{sdk.__name__}._base_client")
    return getattr(base, "httpx2", None) or base.httpx


def anthropic_client(answer: Answer, seen: list[ParsedRequest], **kw: Any) -> Any:
    http = sdk_http(anthropic)
    return anthropic.Anthropic(api_key="unused", base_url=BASE, max_retries=0,
                               http_client=http.Client(transport=anthropic_route(answer, seen, http=http, **kw)))


def openai_client(answer: Answer, seen: list[ParsedRequest], **kw: Any) -> Any:
    http = sdk_http(openai)
    return openai.OpenAI(api_key="unused", base_url=f"{BASE}/v1", max_retries=0,
                         http_client=http.Client(transport=responses_route(answer, seen, http=http, **kw)))


def ollama_client(answer: Answer, seen: list[Any], **kw: Any) -> Any:
    return ollama.Client(host=BASE, transport=ollama_route(answer, seen, **kw))


def weather_call(city: str = "Paris") -> ToolCall:
    return ToolCall(name="get_weather", arguments=json.dumps({"city": city}))


def sse_events(wire: list[str]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for event in "".join(wire).split("\n\n"):
        if event:
            name, data = event.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


# == Anthropic Messages ==============================================================================
ANTHROPIC_TOOL = {"name": "get_weather", "description": "The weather in a city", "input_schema": WEATHER_SCHEMA}


def test_anthropic_tool_use_round_trip_through_the_official_client():
    seen: list[ParsedRequest] = []
    answers = iter([make_reply("Let me look.", calls=(weather_call(),), finish="tool_calls"),
                    make_reply("It is 22 C in Paris.")])
    client = anthropic_client(lambda p: next(answers), seen)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    first_turn = [{"role": "user", "content": "Weather in Paris?"}]
    message = client.messages.create(model="claude-sonnet-4-5", max_tokens=300, system=system,
                                     messages=first_turn, tools=[ANTHROPIC_TOOL], tool_choice={"type": "any"},
                                     metadata={"user_id": "u1"})
    assert isinstance(message, anthropic.types.Message)
    assert message.stop_reason == "tool_use" and message.model == MODEL and message.id.startswith("msg_")
    text, use = message.content
    assert text.text == "Let me look." and use.type == "tool_use" and use.input == {"city": "Paris"}
    parsed = seen[0]
    assert parsed.messages == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Weather in Paris?"}]
    assert parsed.tools == [{"type": "function", "function": {"name": "get_weather", "description":
                                                              "The weather in a city", "parameters": WEATHER_SCHEMA}}]
    assert parsed.tool_choice == "required" and parsed.max_tokens == 300 and parsed.model == MODEL

    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "22 C"}]}
    final = client.messages.create(model="claude-sonnet-4-5", max_tokens=300, system=system, tools=[ANTHROPIC_TOOL],
                                   messages=[*first_turn, message.to_param(), result])
    assert final.stop_reason == "end_turn" and final.content[0].text == "It is 22 C in Paris."
    assistant, tool = seen[1].messages[2:]
    assert assistant["role"] == "assistant" and assistant["content"] == "Let me look."
    (call,) = assistant["tool_calls"]
    assert call["id"] == use.id and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert tool == {"role": "tool", "tool_call_id": use.id, "content": "22 C"}


def test_anthropic_stream_accumulates_to_the_same_message_in_the_official_client():
    seen: list[ParsedRequest] = []
    reply = make_reply("Checking the weather now.", calls=(weather_call("Oslo"), weather_call("Rome")),
                       finish="tool_calls", prompt=40, cached=30, completion=17)
    client = anthropic_client(lambda p: reply, seen)
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=64, tools=[ANTHROPIC_TOOL],
                                messages=[{"role": "user", "content": "Oslo and Rome?"}]) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert seen[0].stream and streamed == reply.content
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert [b.input for b in final.content[1:]] == [{"city": "Oslo"}, {"city": "Rome"}]
    assert [b.id for b in final.content[1:]] == [c.id for c in reply.tool_calls]
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 17
    assert (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (10, 30)  # Anthropic: cache apart


def test_anthropic_every_stream_event_is_a_valid_raw_event():
    adapter = pydantic_adapter(anthropic.types.RawMessageStreamEvent)
    stream = A.Stream(MODEL, input_tokens=9)
    wire = stream.start() + stream.reasoning("hmm") + stream.text("Hi") + stream.text(" there")
    wire += stream.finish(make_reply("Hi there", reasoning="hmm", calls=(weather_call(),), finish="tool_calls"))
    events = sse_events(wire)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    for name, data in events:
        assert data["type"] == name
        if name != "ping":
            adapter.validate_python(data)
    starts = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    indexes = [data["index"] for name, data in events if name == "content_block_start"]
    assert indexes == [0, 1, 2]


@pytest.mark.parametrize(("finish", "stop", "calls", "reason"), [
    ("stop", None, (), "end_turn"), ("length", None, (), "max_tokens"), ("stop", "\n\nHuman:", (), "stop_sequence"),
    ("tool_calls", None, (ToolCall("f", "{}"),), "tool_use"), ("cancelled", None, (), "end_turn")])
def test_anthropic_stop_reasons_validate_as_messages(finish, stop, calls, reason):
    reply = make_reply("ok", calls=calls, finish=finish, stop_sequence=stop)
    body = A.response(reply)
    message = anthropic.types.Message.model_validate(body)
    assert message.stop_reason == reason and message.stop_sequence == stop
    assert (message.usage.input_tokens, message.usage.output_tokens) == (12, 5)


def test_anthropic_count_tokens_and_refusals_reach_the_client_as_its_errors():
    seen: list[ParsedRequest] = []
    client = anthropic_client(lambda p: make_reply("x"), seen)
    counted = client.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "hi"}],
                                           tools=[ANTHROPIC_TOOL])
    assert counted.input_tokens == 21 and seen[0].tools and seen[0].max_tokens == N_CTX
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="claude-x", max_tokens=10,
                               messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}])
    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "remote image URLs are not fetched" in refused.value.body["error"]["message"]
    strict = anthropic_client(lambda p: make_reply("x"), [], strict=True)
    with pytest.raises(anthropic.NotFoundError) as missing:
        strict.messages.create(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["error"]["type"] == "not_found_error"
    assert strict.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]).content


def test_anthropic_error_mid_stream_raises_in_the_official_client():
    failing = make_reply("partial", extras={"fail": ApiError(503, "worker died", code="worker_died")})
    client = anthropic_client(lambda p: failing, [])
    with pytest.raises(anthropic.APIStatusError) as raised:  # noqa: PT012
        with client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]) as s:
            s.get_final_message()
    assert raised.value.body["error"] == {"type": "overloaded_error", "message": "worker died"}


def test_anthropic_errors_have_anthropics_types():
    model = anthropic.types.ErrorResponse if hasattr(anthropic.types, "ErrorResponse") else None
    for status, kind in [(400, "invalid_request_error"), (401, "authentication_error"), (404, "not_found_error"),
                         (429, "rate_limit_error"), (500, "api_error"), (503, "overloaded_error"),
                         (504, "timeout_error")]:
        body = A.error_body(ApiError(status, "why"))
        assert body == {"type": "error", "error": {"type": kind, "message": "why"}}
        if model is not None:
            model.model_validate(body)


def test_anthropic_request_rules():
    body = {"model": "anything", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "x", "signature": "s"},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "é"}},
                                          {"type": "tool_use", "id": "t2", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": [{"type": "text", "text": "boom"}]},
                                     {"type": "tool_result", "tool_use_id": "t2"},
                                     {"type": "text", "text": "go on"}]}],
            "stop_sequences": ["END", ""], "top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "service_tier": "auto", "container": None, "some_future_field": {"x": 1}, "speculative": "off"}
    parsed = A.parse(body, SERVED, N_CTX)
    assert parsed.model == MODEL and parsed.max_tokens == N_CTX and parsed.stop == ["END"]
    assert parsed.sampling.temperature == 1.0 and parsed.sampling.top_k == 5 and parsed.sampling.top_p == 1.0
    assert parsed.sampling.seed == RANDOM_SEED and parsed.speculative is not None and not parsed.stream
    assert parsed.messages[0] == {"role": "user", "content": "ab"}
    assert [c["id"] for c in parsed.messages[1]["tool_calls"]] == ["t1", "t2"]
    assert json.loads(parsed.messages[1]["tool_calls"][0]["function"]["arguments"]) == {"q": "é"}
    assert parsed.messages[2:] == [{"role": "tool", "tool_call_id": "t1", "content": "Error: boom"},
                                   {"role": "tool", "tool_call_id": "t2", "content": ""},
                                   {"role": "user", "content": "go on"}]
    assert parsed.tools is None and parsed.tool_choice == "auto"
    system = A.parse({"system": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
                      "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}, SERVED, N_CTX)
    assert system.messages[0] == {"role": "system", "content": "one\ntwo"} and system.max_tokens == 7


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
     {"type": "function", "function": {"name": "get_weather"}})])
def test_anthropic_tool_choice(choice, expected):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [ANTHROPIC_TOOL], "tool_choice": choice}
    assert A.parse(body, SERVED, N_CTX).tool_choice == expected


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages", "goes in 'system'"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages", "'document'"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web"}]},
     "tools", "server tool"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [ANTHROPIC_TOOL],
      "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice", "not in 'tools'"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", "1 or more"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature", "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"}, "stop_sequences", "list"),
    ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages", "lone surrogate"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image", "source": {}}]}]}]},
     "messages", "image sources of type None"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "messages", "image sources of type 'file'"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
     "messages", "needs its 'data'"),
    ({"messages": [{"role": "assistant", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
     "messages", "'image' blocks are not supported in an assistant turn"),
])
def test_anthropic_refusals_name_the_field(body, param, words):
    with pytest.raises(ApiError) as refused:
        A.parse(body, SERVED, N_CTX)
    assert refused.value.status == 400 and refused.value.param == param and words in refused.value.message


def test_anthropic_json_output_format():
    base = {"messages": [{"role": "user", "content": "x"}]}
    config = {"output_config": {"format": {"type": "json_schema", "schema": WEATHER_SCHEMA}, "effort": "low"}}
    assert A.parse({**base, **config}, SERVED, N_CTX).json_schema == WEATHER_SCHEMA
    assert A.parse({**base, "output_format": {"type": "json_schema", "schema": {}}}, SERVED, N_CTX).json_schema == {}
    assert A.parse(base, SERVED, N_CTX).json_schema is None


def test_anthropic_stream_sends_text_the_deltas_missed_and_an_empty_block_for_an_empty_reply():
    stream = A.Stream(MODEL)
    wire = stream.text("Hel") + stream.finish(make_reply("Hello"))
    texts = [d["delta"]["text"] for n, d in sse_events(wire) if n == "content_block_delta"]
    assert "".join(texts) == "Hello"
    empty = sse_events(A.Stream(MODEL).finish(make_reply("")))
    assert [n for n, _ in empty] == ["message_start", "ping", "content_block_start", "content_block_stop",
                                     "message_delta", "message_stop"]


# == Ollama ==========================================================================================
OLLAMA_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                                 "parameters": WEATHER_SCHEMA}}


def test_ollama_chat_tool_round_trip_through_the_official_client():
    seen: list[Any] = []
    answers = iter([make_reply("", calls=(weather_call(),), finish="tool_calls", extras={"timings": TIMINGS}),
                    make_reply("22 C.", extras={"timings": TIMINGS})])
    client = ollama_client(lambda p: next(answers), seen)
    turn = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    first = client.chat(model="llama3.2", messages=turn, tools=[OLLAMA_TOOL], stream=False,
                        options={"temperature": 0, "num_predict": 50, "num_ctx": 8192, "seed": 3})
    assert isinstance(first, ollama.ChatResponse) and first.done and first.done_reason == "stop"
    (call,) = first.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    parsed = seen[0]
    assert parsed.messages == turn and parsed.max_tokens == 50 and parsed.tools == [OLLAMA_TOOL]
    assert parsed.sampling.temperature == 0 and parsed.sampling.seed == 3 and not parsed.stream
    assert first.prompt_eval_count == 12 and first.eval_count == 5
    assert (first.prompt_eval_duration, first.eval_duration) == (12_500_000, 250_000_000)
    assert first.total_duration == 262_500_000 and first.load_duration == 0

    result = {"role": "tool", "content": "22 C", "tool_name": "get_weather"}
    final = client.chat(model="llama3.2", messages=[*turn, first.message, result], tools=[OLLAMA_TOOL], stream=False)
    assert final.message.content == "22 C."
    assistant, tool = seen[1].messages[2:]
    (asked,) = assistant["tool_calls"]
    assert json.loads(asked["function"]["arguments"]) == {"city": "Paris"}
    assert tool == {"role": "tool", "content": "22 C", "tool_call_id": asked["id"]}


def test_ollama_chat_streams_ndjson_and_the_last_line_has_the_counts():
    seen: list[Any] = []
    reply = make_reply("The sky is blue.", calls=(weather_call(),), finish="length", extras={"timings": TIMINGS})
    client = ollama_client(lambda p: reply, seen)
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": "sky?"}], format="json", stream=True))
    assert seen[0].stream and seen[0].json_schema == {}
    assert all(isinstance(p, ollama.ChatResponse) for p in parts)
    assert "".join(p.message.content or "" for p in parts) == reply.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason == "length" and last.eval_count == 5 and last.message.tool_calls[0].function.arguments
    generated = list(client.generate(model=MODEL, prompt="Once", stream=True))
    assert "".join(p.response for p in generated) == reply.content and generated[-1].done


def test_ollama_generate_templates_unless_raw_and_a_bare_generate_is_a_load_check():
    seen: list[Any] = []
    client = ollama_client(lambda p: make_reply("forty-two", extras={"timings": TIMINGS}), seen)
    answer = client.generate(model=MODEL, prompt="Answer?", system="Be terse.", stream=False,
                             format=WEATHER_SCHEMA, options={"stop": ["\n"], "top_k": 0, "num_predict": -1})
    assert isinstance(answer, ollama.GenerateResponse) and answer.response == "forty-two" and answer.done
    parsed = seen[-1]
    assert parsed.messages == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Answer?"}]
    assert parsed.json_schema == WEATHER_SCHEMA and parsed.stop == ["\n"] and parsed.max_tokens == N_CTX
    assert parsed.sampling.top_k == 0 and parsed.sampling.top_p == 0.9  # Ollama's defaults elsewhere
    client.generate(model=MODEL, prompt="<s>raw", raw=True, stream=False)
    assert seen[-1].prompt == "<s>raw" and seen[-1].messages is None
    loaded = client.generate(model=MODEL)
    assert seen[-1] == O.LoadCheck(MODEL, chat=False) and loaded.done and loaded.done_reason == "load"
    unloaded = client.chat(model=MODEL, messages=[], keep_alive=0)
    assert unloaded.done_reason == "unload" and unloaded.message.content == ""


def test_ollama_model_listing_show_and_ps_parse_in_the_official_client():
    client = ollama_client(lambda p: make_reply(), [])
    (listed,) = client.list().models
    assert listed.model == MODEL and listed.size == 123_456_789 and listed.details.quantization_level == "Q4_K_M"
    assert listed.details.family == "glm4moe" and listed.details.parameter_size == "268.1M"
    assert listed.modified_at.year == 2023 and len(listed.digest) == 64
    shown = client.show(MODEL)
    assert shown.modelinfo["glm4moe.context_length"] == N_CTX and "tools" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "glm4moe" and shown.details.format == "gguf"
    (running,) = client.ps().models
    assert running.context_length == N_CTX and running.expires_at is not None
    assert httpx.Client(transport=ollama_route(lambda p: make_reply(), [])).get(
        f"{BASE}/api/version").json() == {"version": O.OLLAMA_VERSION}


def test_ollama_errors_reach_the_client_as_response_errors():
    client = ollama_client(lambda p: make_reply(), [], strict=True)
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3.2", messages=[{"role": "user", "content": "x"}], stream=False)
    assert missing.value.status_code == 404 and missing.value.error == "model 'llama3.2' not found"
    assert client.chat(model=f"{MODEL}:latest", messages=[{"role": "user", "content": "x"}], stream=False).done
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "x", "images": [""]}], stream=False)
    assert refused.value.status_code == 400 and "images" in refused.value.error
    failing = make_reply("partial", extras={"fail": ApiError(504, "ran past the timeout")})
    streaming = ollama_client(lambda p: failing, [])
    with pytest.raises(ollama.ResponseError) as mid:
        list(streaming.chat(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True))
    assert mid.value.error == "ran past the timeout"


def test_ollama_request_rules():
    body = {"model": "x", "messages": [
        {"role": "user", "content": "two calls"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "a", "arguments": {"n": 1}}},
            {"function": {"name": "b", "arguments": '{"n": 2}'}}]},
        {"role": "tool", "content": "B", "tool_name": "b"},
        {"role": "tool", "content": "A"}],
        "keep_alive": "5m", "think": False, "options": {"mirostat": 0, "num_thread": 2, "seed": -1}}
    parsed = O.parse_chat(body, SERVED, N_CTX)
    calls = parsed.messages[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_1_0", "call_1_1"]  # stable: the same prompt every turn
    assert [m["tool_call_id"] for m in parsed.messages[2:]] == ["call_1_1", "call_1_0"]
    assert parsed.stream and parsed.sampling == O.DEFAULTS  # Ollama streams by default
    assert O.DEFAULTS.seed == RANDOM_SEED  # seed -1: a new one
    assert parsed.max_tokens == N_CTX and parsed.logprobs is None
    assert O.parse_chat({"model": "x", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                         "top_logprobs": 3}, SERVED, N_CTX).logprobs == 3
    assert O.parse_show({"name": "whatever"}, SERVED) == MODEL


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "prompt": "x", "suffix": "y"}, "suffix"),
    ({"model": "m", "prompt": "x", "images": "aGk="}, "images"),
    ({"model": "m", "prompt": "x", "images": [7]}, "images"),
    ({"model": "m", "prompt": "x", "context": [1, 2]}, "context"),
    ({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ({"model": "m", "prompt": "x", "options": {"temperature": "hot"}}, "options.temperature"),
    ({"model": "m", "prompt": "x", "options": {"top_p": 3}}, "options.top_p"),
    ({"model": "m", "prompt": "x", "format": "yaml"}, "format"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
])
def test_ollama_generate_refusals(body, param):
    with pytest.raises(ApiError) as refused:
        O.parse_generate(body, SERVED, N_CTX)
    assert refused.value.param == param and O.error_body(refused.value) == {"error": refused.value.message}


def test_ollama_tool_message_without_a_call_is_refused():
    with pytest.raises(ApiError, match="must follow an assistant message with tool_calls"):
        O.parse_chat({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, SERVED, N_CTX)


def test_ollama_timestamps_and_sizes():
    assert O.created_at(0) == "1970-01-01T00:00:00.000000Z"
    assert [O.parameter_size(n) for n in (None, 268_100_000, 7_615_616_512, 1_000)] == ["", "268.1M", "7.6B", "1.0K"]


# == OpenAI Responses ================================================================================
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "The weather in a city",
                  "parameters": WEATHER_SCHEMA, "strict": True}


def test_responses_function_call_round_trip_through_the_official_client():
    seen: list[ParsedRequest] = []
    answers = iter([make_reply("", calls=(weather_call(),), finish="tool_calls"), make_reply("22 C in Paris.")])
    client = openai_client(lambda p: next(answers), seen)
    turn: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.responses.create(model="gpt-5-codex", instructions="Be brief.", input=turn, tools=[RESPONSES_TOOL],
                                    tool_choice="required", store=False, parallel_tool_calls=False,
                                    reasoning={"effort": "medium", "summary": "auto"},
                                    include=["reasoning.encrypted_content"], prompt_cache_key="abc")
    assert isinstance(first, openai.types.responses.Response) and first.status == "completed"
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert first.tools[0].name == "get_weather" and first.tool_choice == "required" and first.output_text == ""
    parsed = seen[0]
    assert parsed.messages == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Weather in Paris?"}]
    assert parsed.tools == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city", "parameters": WEATHER_SCHEMA, "strict": True}}]
    assert parsed.tool_choice == "required" and parsed.max_tokens == N_CTX and parsed.model == MODEL

    turn += [item.model_dump(exclude_none=True) for item in first.output]
    turn.append({"type": "function_call_output", "call_id": call.call_id, "output": "22 C"})
    final = client.responses.create(model="gpt-5-codex", input=turn, tools=[RESPONSES_TOOL])
    assert final.output_text == "22 C in Paris."
    user, assistant, tool = seen[1].messages
    assert assistant["tool_calls"][0]["id"] == call.call_id and assistant["role"] == "assistant"
    assert tool == {"role": "tool", "tool_call_id": call.call_id, "content": "22 C"}


def test_responses_stream_accumulates_in_the_official_client():
    seen: list[ParsedRequest] = []
    reply = make_reply("Calling two tools.", calls=(weather_call("Oslo"), weather_call("Rome")), finish="tool_calls",
                       prompt=30, cached=20, completion=9)
    client = openai_client(lambda p: reply, seen)
    with client.responses.stream(model="m", input="Oslo and Rome?", tools=[RESPONSES_TOOL]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert seen[0].stream and "".join(deltas) == reply.content == final.output_text
    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert [json.loads(item.arguments)["city"] for item in final.output[1:]] == ["Oslo", "Rome"]
    assert [item.call_id for item in final.output[1:]] == [c.id for c in reply.tool_calls]
    assert final.usage.input_tokens == 30 and final.usage.input_tokens_details.cached_tokens == 20
    assert final.usage.output_tokens == 9 and final.usage.total_tokens == 39


def test_responses_every_stream_event_is_a_valid_event_with_increasing_sequence_numbers():
    adapter = pydantic_adapter(openai.types.responses.ResponseStreamEvent)
    stream = R.Stream(MODEL, {"input": "x", "tools": [RESPONSES_TOOL]})
    entries = (TokenLogprob("Hi", -0.1, [72, 105], [("Hello", -2.5, [72])]),)
    wire = stream.start() + stream.reasoning("thinking") + stream.text("Hi")
    wire += stream.finish(make_reply("Hi", reasoning="thinking", calls=(weather_call(),), logprobs=entries,
                                     finish="tool_calls"))
    events = sse_events(wire)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    for name, data in events:
        assert data["type"] == name
        adapter.validate_python(data)
    completed = events[-1][1]["response"]
    assert events[-1][0] == "response.completed" and [o["type"] for o in completed["output"]] == [
        "reasoning", "message", "function_call"]
    assert completed["output"][1]["content"][0]["logprobs"][0]["top_logprobs"][0]["token"] == "Hello"
    openai.types.responses.Response.model_validate(completed)


def test_responses_max_output_tokens_is_incomplete_and_json_formats_parse():
    seen: list[ParsedRequest] = []
    client = openai_client(lambda p: make_reply('{"city": "Pa', finish="length"), seen)
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER_SCHEMA, "strict": True}}
    cut = client.responses.create(model="m", input="JSON please", max_output_tokens=8, text=fmt, temperature=0.2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].status == "incomplete" and cut.max_output_tokens == 8 and cut.temperature == 0.2
    assert seen[0].json_schema == WEATHER_SCHEMA and seen[0].max_tokens == 8 and seen[0].sampling.temperature == 0.2
    client.responses.create(model="m", input="x", text={"format": {"type": "json_object"}})
    assert seen[1].json_schema == {}
    client.responses.create(model="m", input="x", text={"format": {"type": "text"}, "verbosity": "low"})
    assert seen[2].json_schema is None


def test_responses_refusals_reach_the_client_as_bad_requests():
    client = openai_client(lambda p: make_reply("x"), [])
    with pytest.raises(openai.BadRequestError) as stateless:
        client.responses.create(model="m", input="again", previous_response_id="resp_123")
    assert stateless.value.body["param"] == "previous_response_id"
    assert "keeps no responses" in stateless.value.body["message"]
    with pytest.raises(openai.BadRequestError) as tool:
        client.responses.create(model="m", input="x", tools=[{"type": "web_search"}, RESPONSES_TOOL])
    assert "'web_search'" in tool.value.body["message"]
    for image, words in (({"type": "input_image", "file_id": "file-1"}, "'file_id'"),
                         ({"type": "input_image", "image_url": "http://example.com/cat.png"}, "not fetched")):
        with pytest.raises(openai.BadRequestError) as picture:
            client.responses.create(model="m", input=[{"role": "user", "content": [image]}])
        assert words in picture.value.body["message"] and picture.value.body["param"] == "input"
    with pytest.raises(openai.BadRequestError) as audio:
        client.responses.create(model="m", input=[{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}])
    assert "'input_audio'" in audio.value.body["message"]
    strict = openai_client(lambda p: make_reply("x"), [], strict=True)
    with pytest.raises(openai.NotFoundError):
        strict.responses.create(model="gpt-5", input="x")


def test_responses_error_mid_stream_is_an_error_event_and_a_failed_response():
    failing = make_reply("partial", extras={"fail": ApiError(503, "worker died", code="worker_died")})
    client = openai_client(lambda p: failing, [])
    events = list(client.responses.create(model="m", input="x", stream=True))
    assert events[-2].type == "error" and events[-2].message == "worker died" and events[-2].code == "worker_died"
    assert events[-1].type == "response.failed" and events[-1].response.error.code == "server_error"


def test_responses_input_items():
    body = {"input": [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Do "},
                                                        {"type": "input_text", "text": "it"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "On it.",
                                                              "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": '{"cmd": "ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": '{"cmd": "pwd"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a b"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "/"}]}],
        "store": True, "truncation": "auto", "user": "u", "metadata": {"k": "v"}, "future_field": 1}
    parsed = R.parse(body, SERVED, N_CTX)
    assert parsed.messages[:2] == [{"role": "system", "content": "Rules."}, {"role": "user", "content": "Do it"}]
    assistant = parsed.messages[2]
    assert assistant["content"] == "On it." and [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert parsed.messages[3:] == [{"role": "tool", "tool_call_id": "c1", "content": "a b"},
                                   {"role": "tool", "tool_call_id": "c2", "content": "/"}]
    assert parsed.sampling.temperature == 1.0 and parsed.logprobs is None and not parsed.stream
    logged = R.parse({"input": "x", "top_logprobs": 2, "include": [R.LOGPROBS_INCLUDE]}, SERVED, N_CTX)
    assert logged.logprobs == 2


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": "x", "conversation": "conv_1"}, "conversation", "stateless"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "item_reference"),
    ({"input": [{"type": "local_shell_call", "call_id": "c"}]}, "input", "'local_shell_call'"),
    ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools", "'custom'"),
    ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": [RESPONSES_TOOL]},
     "tool_choice", "not in 'tools'"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text", "json_schema"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "1 or more"),
    ({"input": []}, "input", "non-empty"),
    ({"input": "x", "background": True}, "background", "background"),
])
def test_responses_refusals_name_the_field(body, param, words):
    with pytest.raises(ApiError) as refused:
        R.parse(body, SERVED, N_CTX)
    assert refused.value.status == 400 and refused.value.param == param and words in refused.value.message
    assert R.error_body(refused.value)["error"]["param"] == param


# -- shared -----------------------------------------------------------------------------------------
def pydantic_adapter(annotation: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(annotation)


@pytest.mark.parametrize("module", [A, O, R])
def test_any_model_name_is_served_by_the_loaded_model_unless_strict(module):
    parse = module.parse_chat if module is O else module.parse
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "input": "x"}
    assert parse(body, SERVED, N_CTX).model == MODEL
    assert parse({k: v for k, v in body.items() if k != "model"}, SERVED, N_CTX).model == MODEL
    with pytest.raises(ApiError) as refused:
        parse(body, SERVED, N_CTX, strict_model=True)
    assert refused.value.status == 404
    assert parse({**body, "model": f"{MODEL}.gguf"}, SERVED, N_CTX, strict_model=True).model == MODEL


@pytest.mark.parametrize("module", [A, O, R])
def test_a_stream_finishes_with_what_its_deltas_missed(module):
    """The text and thinking a stream's deltas did not carry (held back, or never streamed) go out at the end,
    so the streamed reply is the whole reply."""
    stream = module.Stream(MODEL)
    wire = stream.start() + stream.text("Hel") + stream.finish(make_reply("Hello", reasoning="because"))
    if module is O:
        objects = [json.loads(line) for line in "".join(wire).splitlines()]
        assert "".join(o["message"]["content"] for o in objects) == "Hello" and objects[-1]["done"]
        silent = [json.loads(line) for line in "".join(O.Stream(MODEL).finish(make_reply("Hi", reasoning="hm")))
                  .splitlines()]
        assert [o["message"].get("thinking") for o in silent] == ["hm", None, None]
        return
    events = sse_events(wire)
    if module is A:
        assert "".join(d["delta"]["text"] for n, d in events if d.get("delta", {}).get("type") == "text_delta") \
            == "Hello"
        fresh = sse_events(A.Stream(MODEL).finish(make_reply("Hi", reasoning="hm")))
        starts = [d["content_block"]["type"] for n, d in fresh if n == "content_block_start"]
        assert starts == ["thinking", "text"]
    else:
        assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == "Hello"
        fresh = sse_events(R.Stream(MODEL).finish(make_reply("Hi", reasoning="hm")))
        assert [o["type"] for o in fresh[-1][1]["response"]["output"]] == ["reasoning", "message"]


def test_the_speculative_report_says_what_ran_not_what_was_asked():
    from engine.server.openai_format import speculative_report
    from engine.speculative.settings import mtp
    from engine.speculative.stats import StatsSnapshot

    # asked for 8 on a model whose three chained heads draft at most 3: the statistics say what ran
    ran = speculative_report(StatsSnapshot(settings=mtp(3), rounds=2, drafted=6, accepted=4), mtp(8))
    assert (ran["mode"], ran["n_max"], ran["drafted"]) == ("mtp", 3, 6)
    assert speculative_report(None, mtp(8))["n_max"] == 8  # no statistics (it failed first): what was asked


def test_the_speculative_extension_takes_a_draft_sampling():
    from engine.server.openai_format import speculative_from

    asked = speculative_from({"mode": "mtp", "n_max": 2, "draft_sampling": "probabilistic"})
    assert asked is not None and asked.draft_sampling == "probabilistic" and asked.label.endswith("probabilistic")
    assert speculative_from({"mode": "mtp"}).draft_sampling == "match"
    with pytest.raises(ApiError, match="draft_sampling must be one of"):
        speculative_from({"mode": "mtp", "draft_sampling": "sometimes"})


# -- images: every API's image parts become the worker's markers and the same sources ----------------
PNG = "iVBORw0KGgo="  # base64 as the clients send it (the server decodes it later, in plan.make)


def test_anthropic_image_blocks_become_markers_in_place_with_their_sources_in_order():
    shot = {"type": "image", "source": {"type": "url", "url": "data:image/jpeg;base64,AAAA"}}
    parsed = A.parse({"max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a "},
                                     {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": PNG}},
                                     {"type": "text", "text": " b"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "here:"}, shot]},
                                     {"type": "image", "source": {"type": "url", "url": "/tmp/c.png"}}]}]},
        SERVED, N_CTX)
    assert parsed.messages[0]["content"] == f"a {IMAGE_MARKER} b"
    assert parsed.messages[2] == {"role": "tool", "tool_call_id": "t1", "content": f"here:{IMAGE_MARKER}"}
    assert parsed.messages[3] == {"role": "user", "content": IMAGE_MARKER}
    assert parsed.images == [f"data:image/png;base64,{PNG}", "data:image/jpeg;base64,AAAA", "/tmp/c.png"]


def test_responses_input_images_become_markers_and_a_kept_response_keeps_its_images():
    kept = ([{"role": "user", "content": f"{IMAGE_MARKER}?"}, {"role": "assistant", "content": "red"}], ["data:,1"])
    parsed = R.parse({"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "low"},
        {"type": "input_text", "text": " and this?"}]}], "previous_response_id": "resp_1"},
        SERVED, N_CTX, history=lambda rid: kept)
    assert [m["content"] for m in parsed.messages] == [f"{IMAGE_MARKER}?", "red", f"{IMAGE_MARKER} and this?"]
    assert parsed.images == ["data:,1", f"data:image/png;base64,{PNG}"]
    store = ResponseStore()
    store.keep("resp_2", parsed.messages, make_reply("blue"), parsed.images)
    messages, images = store.conversation("resp_2")
    assert images == parsed.images and messages[-1] == {"role": "assistant", "content": "blue"}


def test_ollama_images_go_where_ollama_puts_them():
    parsed = O.parse_chat({"messages": [{"role": "user", "content": "what?", "images": [PNG]},
                                        {"role": "assistant", "content": "red"},
                                        {"role": "user", "content": "and [img] or [img]?", "images": ["AA", "BB"]}]},
                          SERVED, N_CTX)
    assert [m["content"] for m in parsed.messages] == [f"{IMAGE_MARKER}what?", "red",
                                                       f"and {IMAGE_MARKER} or {IMAGE_MARKER}?"]
    assert parsed.images == [f"data:image/*;base64,{x}" for x in (PNG, "AA", "BB")]
    generated = O.parse_generate({"prompt": "what?", "images": [PNG], "system": "terse"}, SERVED, N_CTX)
    assert generated.messages[1]["content"] == f"{IMAGE_MARKER}what?" and len(generated.images) == 1
    raw = O.parse_generate({"prompt": "what?", "images": [PNG, PNG], "raw": True}, SERVED, N_CTX)
    assert raw.prompt == f"{IMAGE_MARKER}{IMAGE_MARKER}what?" and len(raw.images) == 2

"""One agent loop through real families' chat templates: the synthetic MTP model is given the
template of Qwen3.5 (Qwen3 XML calls) or of Qwen3 (Hermes JSON calls), as llama.cpp bundles them.
With ``tool_choice: "required"`` a grammar in the family's syntax makes it call a tool; the reply
is parsed with that syntax, the tool's result goes back through the same template, and the final
answer comes. Greedy output is the same with MTP on and off, at every step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from engine.server.engine_link import WorkerLink, load_request_for
from engine.server.runner import ServerThread
from tests import gguf_mutate as G
from tests.engine.conftest import synth
from tests.server.conftest import MODEL_ID, start_server
from tests.templates import bundled_templates

WRITE = {"type": "function", "function": {
    "name": "write_file", "description": "Write a file.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["path", "text"],
                   "properties": {"path": {"type": "string", "enum": ["a.py", "b.py"]},
                                  "text": {"type": "string", "maxLength": 40}}}}}
RUN = {"type": "function", "function": {
    "name": "run", "parameters": {"type": "object", "required": ["cmd"], "additionalProperties": False,
                                  "properties": {"cmd": {"enum": ["pytest", "ls"]}}}}}


def serve_with_template(name: str, tmp_path: Path) -> tuple[ServerThread, WorkerLink]:
    """The synthetic MTP model (heads reading the hidden state) carrying one of llama.cpp's bundled templates."""
    source = synth("glm4moe", "mixed", reads="hidden", seed=5).path("combined")
    gguf = G.parse(source).with_kv("tokenizer.chat_template", G.value(G.STRING, bundled_templates()[name]))
    link = WorkerLink(load_request_for(str(gguf.write(tmp_path / "templated.gguf")), n_ctx=8192, n_threads=1))
    return start_server(link), link


@pytest.fixture(scope="module", params=[("Qwen3.5-4B.jinja", "qwen3_xml"), ("Qwen-Qwen3-0.6B.jinja", "hermes")],
                ids=["qwen3.5-xml", "qwen3-hermes"])
def templated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    name, family = request.param
    server, link = serve_with_template(name, tmp_path_factory.mktemp("templated"))
    yield server, link, family
    server.stop()
    link.close()


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """Qwen3.5's template: its generation prompt opens a thinking block (``<think>``)."""
    server, link = serve_with_template("Qwen3.5-4B.jinja", tmp_path_factory.mktemp("qwen35"))
    yield server
    server.stop()
    link.close()


def test_the_model_says_its_tool_syntax_and_the_loop_runs_the_same_with_and_without_mtp(templated):
    server, link, family = templated
    assert link.model().tool_syntax == family
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)
    question = [{"role": "user", "content": "Write a test file, then run it."}]
    seen = {}
    for mode in ("off", "mtp"):
        # no thinking block in the prompt: the forced call's grammar holds from the first token (with one, it
        # waits for </think>, which this synthetic model never writes)
        spec = {"speculative": mode, "chat_template_kwargs": {"enable_thinking": False}}
        first = client.chat.completions.create(model=MODEL_ID, messages=question, tools=[WRITE, RUN],
                                               tool_choice="required", temperature=0, max_tokens=200,
                                               extra_body=spec)
        (call,) = first.choices[0].message.tool_calls
        arguments = json.loads(call.function.arguments)
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name in ("write_file", "run")
        if call.function.name == "write_file":
            assert arguments["path"] in ("a.py", "b.py") and isinstance(arguments["text"], str)
        history = [*question, first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "ok"}]
        final = client.chat.completions.create(model=MODEL_ID, messages=history, tools=[WRITE, RUN],
                                               temperature=0, max_tokens=16, extra_body=spec)
        # the call and its result were rendered by the family's template: the prompt grew by both
        assert final.usage.prompt_tokens > first.usage.prompt_tokens + 10
        seen[mode] = (call.function.name, call.function.arguments, final.choices[0].message.content,
                      final.usage.prompt_tokens)
        if mode == "mtp":
            assert first.model_extra["timings"]["draft_n"] > 0
    assert seen["mtp"] == seen["off"]


THOUGHT = 'root ::= "step one" "\\n</think>\\n\\n" "done"'  # a reasoning model's shape, forced by a grammar


def test_a_thinking_block_the_template_opened_comes_back_as_reasoning_in_every_api(qwen35):
    server = qwen35
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)
    question = [{"role": "user", "content": "Think, then answer."}]
    reply = client.chat.completions.create(model=MODEL_ID, messages=question, temperature=0, max_tokens=40,
                                           extra_body={"grammar": THOUGHT})
    message = reply.choices[0].message
    assert message.content == "done" and message.model_extra["reasoning_content"] == "step one"
    chunks = list(client.chat.completions.create(model=MODEL_ID, messages=question, temperature=0, max_tokens=40,
                                                 stream=True, extra_body={"grammar": THOUGHT}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "done"
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas).strip() == "step one"
    raw = client.chat.completions.create(model=MODEL_ID, messages=question, temperature=0, max_tokens=40,
                                         extra_body={"grammar": THOUGHT, "reasoning_format": "none"})
    assert raw.choices[0].message.content == "step one\n</think>\n\ndone"  # llama-server's "none": as written
    closed = client.chat.completions.create(  # the template closes the block itself: nothing to split
        model=MODEL_ID, messages=question, temperature=0, max_tokens=40,
        extra_body={"grammar": THOUGHT, "chat_template_kwargs": {"enable_thinking": False}})
    assert closed.usage.prompt_tokens > reply.usage.prompt_tokens
    assert closed.choices[0].message.content == "step one\n</think>\n\ndone"
    import anthropic

    claude = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="x", max_retries=0,
                                 timeout=300)
    message = claude.messages.create(model="m", max_tokens=24, messages=question, extra_body={"temperature": 0})
    # a block never closed within max_tokens: all of it is thinking, the answer is empty
    assert [b.type for b in message.content] == ["thinking", "text"] and message.stop_reason == "max_tokens"
    assert message.content[0].thinking and message.content[1].text == ""


def test_a_forced_call_waits_for_the_end_of_an_opened_thinking_block(qwen35):
    # Qwen3.5 thinks first: the call's grammar holds from </think> on, so the reasoning is free text (this
    # synthetic model never closes its block, so no call comes within the limit; a real one does)
    client = openai.OpenAI(base_url=qwen35.base_url, api_key="x", max_retries=0, timeout=300)
    reply = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Run it."}],
                                           tools=[RUN], tool_choice="required", temperature=0, max_tokens=24)
    message = reply.choices[0].message
    assert not message.tool_calls and reply.choices[0].finish_reason == "length"
    assert "<tool_call>" not in message.model_extra["reasoning_content"]  # free thinking, not a forced call

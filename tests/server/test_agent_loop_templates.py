"""One agent loop through real families' chat templates: the synthetic MTP model is given the
template of Qwen3.5 (Qwen3 XML calls) or of Qwen3 (Hermes JSON calls), as llama.cpp bundles them.
With ``tool_choice: "required"`` a grammar in the family's syntax makes it call a tool; the reply
is parsed with that syntax, the tool's result goes back through the same template, and the final
answer comes. Greedy output is the same with MTP on and off, at every step."""

from __future__ import annotations

import json
from collections.abc import Iterator

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


@pytest.fixture(scope="module", params=[("Qwen3.5-4B.jinja", "qwen3_xml"), ("Qwen-Qwen3-0.6B.jinja", "hermes")],
                ids=["qwen3.5-xml", "qwen3-hermes"])
def templated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    name, family = request.param
    source = synth("glm4moe", "mixed", reads="hidden", seed=5).path("combined")
    gguf = G.parse(source).with_kv("tokenizer.chat_template", G.value(G.STRING, bundled_templates()[name]))
    path = gguf.write(tmp_path_factory.mktemp("templated") / "templated.gguf")
    link = WorkerLink(load_request_for(str(path), n_ctx=8192, n_threads=1))
    server: ServerThread = start_server(link)
    yield server, link, family
    server.stop()
    link.close()


def test_the_model_says_its_tool_syntax_and_the_loop_runs_the_same_with_and_without_mtp(templated):
    server, link, family = templated
    assert link.model().tool_syntax == family
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=300)
    question = [{"role": "user", "content": "Write a test file, then run it."}]
    seen = {}
    for mode in ("off", "mtp"):
        spec = {"speculative": mode}
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

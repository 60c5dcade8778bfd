"""Tool calls in the model's own syntax (engine/generation/tool_calls.py), against the chat templates
llama.cpp bundles: each renders tools and a call history, and the call each one writes for the
assistant reads back with the family its text names. Then the parser on hand-written replies, and
the forced-call grammars, compiled and checked by llama.cpp itself.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import TemplateError
from engine.generation import chat_template
from engine.generation import tool_calls as tc
from tests.templates import bundled_templates

ROOT = Path(__file__).resolve().parents[2]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "days": {"type": "integer", "description": "How many days"},
            "zip": {"type": "string", "description": "A postcode"},
            "opts": {"type": "object", "description": "Options"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "description": "The zone"}}}}},
]
# a nested object, a list, a float, a boolean, non-ASCII text, and a string that reads as a number
WEATHER = ("get_weather", {"city": "Zürich", "days": 3, "zip": "8001",
                           "opts": {"units": "metric", "hours": [6, 12.5], "alerts": True, "note": "naïve ✓"}})
TIME = ("get_time", {"zone": "Europe/Paris"})
TIME_UTC = ("get_time", {"zone": "UTC"})


def _conversation(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A user asks, the assistant calls ``calls`` (OpenAI shape), the tools answer."""
    ids = [f"call0000{i}" for i in range(1, len(calls) + 1)]  # 9 letters and digits: Mistral's templates insist
    return [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "What is the weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in zip(ids, calls, strict=True)]},
        *({"role": "tool", "tool_call_id": i, "name": n, "content": '{"temp": 21}'}
          for i, (n, _) in zip(ids, calls, strict=True)),
    ]


# -- the templates llama.cpp bundles ------------------------------------------------------------

@pytest.fixture(scope="module")
def bundled() -> dict[str, str]:
    return bundled_templates()


# Templates that refuse this conversation for a reason of their own, and the words they say it with.
REFUSES = {
    "fireworks-ai-llama-3-firefunction-v2.jinja":
        ("'functions' is undefined", "needs `functions` and `datetime`, which only its vendor's server passed"),
    "google-gemma-2-2b-it.jinja": ("System role not supported", "says so (raise_exception); it has no tools"),
}
# Templates that render one call only (raise_exception: "This model only supports single tool-calls at once!").
SINGLE_CALL = {"meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
               "meta-llama-Llama-3.3-70B-Instruct.jinja"}
# Writes an assistant's calls only when its content is null; llama.cpp passes "" there, and so do we.
CALLS_UNSEEN = {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"}

FAMILY = {
    "Qwen3-Coder.jinja": tc.QWEN3_XML, "Qwen3.5-4B.jinja": tc.QWEN3_XML, "StepFun3.5-Flash.jinja": tc.QWEN3_XML,
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": tc.QWEN3_XML,
    "Qwen-Qwen3-0.6B.jinja": tc.HERMES, "Qwen-Qwen2.5-7B-Instruct.jinja": tc.HERMES, "Qwen-QwQ-32B.jinja": tc.HERMES,
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": tc.HERMES,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": tc.HERMES,
    "GLM-4.6.jinja": tc.GLM45, "GLM-4.7-Flash.jinja": tc.GLM45, "inclusionai-ling-3.0-flash.jinja": tc.GLM45,
    "tencent-Hy3.jinja": tc.HY3,
    "deepseek-ai-DeepSeek-V3.1.jinja": tc.DEEPSEEK_V3, "llama-cpp-deepseek-r1.jinja": tc.DEEPSEEK_V3,
    "deepseek-ai-DeepSeek-V3.2.jinja": tc.DSML, "deepseek-ai-DeepSeek-V4.jinja": tc.DSML,
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": tc.MISTRAL, "mistralai-Mistral-Nemo-Instruct-2407.jinja": tc.MISTRAL,
    "unsloth-mistral-Devstral-Small-2507.jinja": tc.MISTRAL,
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": tc.MISTRAL,
    "meta-llama-Llama-3.1-8B-Instruct.jinja": tc.LLAMA3, "meta-llama-Llama-3.2-3B-Instruct.jinja": tc.LLAMA3,
    "meta-llama-Llama-3.3-70B-Instruct.jinja": tc.LLAMA3,
    "Kimi-K2-Instruct.jinja": tc.KIMI_K2, "moonshotai-Kimi-K2.jinja": tc.KIMI_K2, "MiniMax-M2.jinja": tc.MINIMAX_M2,
    # no tool support at all
    "google-gemma-2-2b-it.jinja": None, "microsoft-Phi-3.5-mini-instruct.jinja": None,
    "llama-cpp-rwkv-world.jinja": None,
}


@pytest.mark.parametrize("name", sorted(FAMILY))
def test_the_family_is_read_from_the_template(bundled, name):
    assert tc.family_of(bundled[name]) == FAMILY[name]


def test_the_generic_template_writes_hermes_calls():
    assert tc.family_of(chat_template.GENERIC_TEMPLATE) == tc.HERMES
    assert tc.family_of(None) is None and tc.family_of("") is None


def test_every_bundled_template_renders_tools_calls_and_results(bundled):
    failures = {}
    for name, template in sorted(bundled.items()):
        try:
            chat_template.render(_conversation([WEATHER]), template, tools=TOOLS, bos_token="<s>", eos_token="</s>")
        except TemplateError as exc:
            failures[name] = str(exc)
    assert sorted(failures) == sorted(REFUSES), failures
    for name, (words, _reason) in REFUSES.items():
        assert words in failures[name]


def _assistant_part(template: str, messages: list[dict[str, Any]]) -> str:
    """What the template writes from the assistant's calls on: the whole conversation's text past
    where the conversation up to the user's question ends."""
    before = chat_template.render(messages[:2], template, tools=TOOLS, add_generation_prompt=False).text
    whole = chat_template.render(messages, template, tools=TOOLS, add_generation_prompt=False).text
    return whole[len(os.path.commonprefix([before, whole])):]


def test_each_family_reads_back_the_calls_its_templates_write(bundled):
    """This proves the parser reads the syntax the templates themselves write (one call, then two in
    parallel), for every bundled template whose family is known."""
    checked = set()
    for name, template in sorted(bundled.items()):
        family = tc.family_of(template)
        if family is None or name in REFUSES:
            continue
        if name in CALLS_UNSEEN:
            assert tc.parse(family, _assistant_part(template, _conversation([WEATHER])), TOOLS)[1] == []
            continue
        for calls in ([WEATHER], [WEATHER, TIME]):
            if len(calls) > 1 and name in SINGLE_CALL:
                with pytest.raises(TemplateError, match="single tool-calls"):
                    _assistant_part(template, _conversation(calls))
                continue
            content, got = tc.parse(family, _assistant_part(template, _conversation(calls)), TOOLS)
            assert [(c.name, json.loads(c.arguments)) for c in got] == calls, (name, got)
            assert tc.start_marker(family) not in content, (name, content)
        checked.add(family)
    assert checked == set(tc.FAMILIES)


def test_mistral_templates_want_call_ids_of_nine_letters_and_digits(bundled):
    # which is why parse gives the mistral family's calls such ids
    messages = _conversation([TIME])
    messages[2]["tool_calls"][0]["id"] = messages[3]["tool_call_id"] = "call_0123456789abcdef"
    with pytest.raises(TemplateError, match="length 9"):
        chat_template.render(messages, bundled["mistralai-Mistral-Nemo-Instruct-2407.jinja"], tools=TOOLS)


def test_a_template_that_does_not_iterate_the_arguments_gets_their_text(bundled):
    # functionary v3.2 concatenates the arguments; most templates iterate or tojson them
    text = _assistant_part(bundled["meetkai-functionary-medium-v3.2.jinja"], _conversation([TIME]))
    assert '>>>get_time\n{"zone": "Europe/Paris"}' in text


def test_the_generic_template_renders_and_reads_back():
    messages = _conversation([WEATHER, TIME])
    text = chat_template.render(messages, chat_template.GENERIC_TEMPLATE, tools=TOOLS).text
    assert text.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]["function"]["name"]) in text and "<tools>" in text
    assert text.count("<tool_response>\n") == 2 and text.endswith("<|im_start|>assistant\n")
    _, calls = tc.parse(tc.HERMES, _assistant_part(chat_template.GENERIC_TEMPLATE, messages), TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [WEATHER, TIME]
    plain = chat_template.render(messages[:2], chat_template.GENERIC_TEMPLATE).text
    assert plain == ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n"
                     "What is the weather in Zürich?<|im_end|>\n<|im_start|>assistant\n")


# -- rendering: what templates are given --------------------------------------------------------

def test_tools_are_undefined_unless_given():
    probe = "{{ 'yes' if tools is defined else 'no' }}"
    assert chat_template.render([], probe).text == "no"
    assert chat_template.render([], probe, tools=[]).text == "yes"


def test_arguments_reach_the_template_as_an_object_and_the_callers_messages_stay_untouched():
    template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{% for k, v in c.function.arguments|items %}"
                "{{ k }}={{ v }};{% endfor %}{% endfor %}{% endfor %}")
    messages = _conversation([TIME])
    before = json.dumps(messages)
    assert chat_template.render(messages, template).text == "zone=Europe/Paris;"
    assert json.dumps(messages) == before


def test_arguments_that_are_no_json_object_stay_text():
    template = "{% for c in messages[0].tool_calls %}{{ c.function.arguments is string }}{% endfor %}"
    messages = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "not json"}},
        {"id": "b", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}]
    assert chat_template.render(messages, template).text == "TrueTrue"


def test_tojson_writes_prompts_not_html():
    out = chat_template.render([], "{{ {'a': '<b>&\\'é'}|tojson }} {{ [1]|tojson(indent=2) }} "
                                   "{{ {'k': 'é'}|tojson(ensure_ascii=True, separators=(',', ':')) }}").text
    assert out == '{"a": "<b>&\'é"} [\n  1\n] {"k":"\\u00e9"}'


def test_tojson_indent_is_bounded():
    with pytest.raises(TemplateError, match="indented"):
        chat_template.render([], "{{ [[1]]|tojson(indent=100) }}")


def test_loop_controls_generation_blocks_and_list_append_work():
    template = ("{% set q = namespace(ids=[]) %}{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}"
                "{% if i == 3 %}{% break %}{% endif %}{% set _ = q.ids.append(i) %}{% endfor %}"
                "{% generation %}{{ q.ids }}{{ q.ids.pop(0) }}{% endgeneration %}")
    assert chat_template.render([], template).text == "[0, 2]0"


def test_a_growing_list_still_meets_the_size_limit():
    bomb = "{% set l = [] %}{% for i in range(100000) %}{% set _ = l.extend(range(99999)) %}{% endfor %}"
    with pytest.raises(TemplateError, match="limit"):
        chat_template.render([], bomb, max_chars=1_000_000, time_limit_s=5)


# -- parse, on replies written by hand ----------------------------------------------------------

def _calls(family: str, text: str) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in tc.parse(family, text, TOOLS)[1]]


def test_parallel_calls_all_come_back_in_order():
    text = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert _calls(tc.HERMES, text) == [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Oslo"})]
    xml = ("<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>\n"
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")
    assert _calls(tc.QWEN3_XML, xml) == [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Oslo"})]


def test_text_before_a_call_is_the_content():
    content, calls = tc.parse(tc.HERMES, 'Let me look.\n\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
                                         "</tool_call>")
    assert content == "Let me look." and [c.name for c in calls] == ["get_time"]
    content, calls = tc.parse(tc.GLM45, "Checking.<tool_call>get_time\n<arg_key>zone</arg_key>\n"
                                        "<arg_value>UTC</arg_value>\n</tool_call>")
    assert content == "Checking." and json.loads(calls[0].arguments) == {"zone": "UTC"}


def test_a_reply_without_calls_is_all_content_untouched():
    assert tc.parse(tc.HERMES, "  Just text.\n") == ("  Just text.\n", [])


@pytest.mark.parametrize(("family", "text"), [
    (tc.HERMES, '<tool_call>\n{"name": "get_time", "arguments": {\n</tool_call>'),
    (tc.HERMES, '<tool_call>\n{"arguments": {}}\n</tool_call>'),
    (tc.HERMES, '<tool_call>\n{"name": "get_time", "arguments": [1]}\n</tool_call>'),
    (tc.HERMES, '<tool_call>\n{"name": "get_time", "arguments": {}} and more\n</tool_call>'),
    (tc.QWEN3_XML, "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC"),
    (tc.QWEN3_XML, "<tool_call>\nprose\n</tool_call>"),
    (tc.GLM45, "<tool_call>\n</tool_call>"),
    (tc.GLM45, "<tool_call>get_time\n<arg_key>zone</arg_key>stray</tool_call>"),
    (tc.DEEPSEEK_V3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{oops}<｜tool▁call▁end｜>"),
    (tc.MISTRAL, "[TOOL_CALLS]get_time[ARGS]{"),
    (tc.MISTRAL, '[TOOL_CALLS][{"name": 3, "arguments": {}}]'),
    (tc.LLAMA3, '{"name": "get_time"'),
    (tc.LLAMA3, '{"title": "get_time", "parameters": {}}'),
    (tc.KIMI_K2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>"
                 "nope<|tool_call_end|><|tool_calls_section_end|>"),
    (tc.MINIMAX_M2, '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="zone">UTC</invoke>'),
    (tc.DSML, "<｜DSML｜function_calls>\nhello\n</｜DSML｜function_calls>"),
])
def test_malformed_calls_stay_content(family, text):
    assert tc.parse(family, text, TOOLS) == (text, [])


def test_nested_and_unicode_arguments_survive():
    args = {"a": {"b": [1, {"c": None}], "d": "日本語 ✓"}, "e": -1.5e3}
    text = f"<tool_call>\n{json.dumps({'name': 'get_time', 'arguments': args}, ensure_ascii=True)}\n</tool_call>"
    (call,) = tc.parse(tc.HERMES, text)[1]
    assert json.loads(call.arguments) == args and "日本語" in call.arguments
    assert call.arguments == json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def test_xml_values_are_json_when_they_read_as_json_unless_declared_strings():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
            "<parameter=days>\n7\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n"
            '<parameter=opts>\n{"units": "imperial"}\n</parameter>\n</function>\n</tool_call>')
    assert _calls(tc.QWEN3_XML, text) == [("get_weather", {"city": "New York", "days": 7, "zip": "10001",
                                                          "opts": {"units": "imperial"}})]
    _, (untyped,) = tc.parse(tc.QWEN3_XML, text)  # without the tools, "10001" reads as a number
    assert json.loads(untyped.arguments)["zip"] == 10001


def test_each_family_reads_its_variants():
    assert _calls(tc.DEEPSEEK_V3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
                                  '{"zone": "UTC"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>') == [TIME_UTC]
    assert _calls(tc.DEEPSEEK_V3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
                                  '{"zone": "UTC"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>') == [TIME_UTC]
    assert _calls(tc.MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]') == [TIME_UTC]
    assert _calls(tc.MISTRAL, '[TOOL_CALLS]get_time[CALL_ID]abcDEF123[ARGS]{"zone": "UTC"}') == [TIME_UTC]
    assert _calls(tc.MISTRAL, '[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}'
                  ) == [TIME_UTC, TIME_UTC]
    assert _calls(tc.LLAMA3, '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}') == [TIME_UTC]
    assert _calls(tc.LLAMA3, '{"type": "function", "name": "get_time", "parameters": {"zone": "UTC"}}; '
                             '{"name": "get_time", "arguments": {"zone": "UTC"}}') == [TIME_UTC, TIME_UTC]
    assert _calls(tc.DSML, '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="zip" '
                           'string="true">007</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2'
                           "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>") == [
        ("get_weather", {"zip": "007", "days": 2})]



def test_call_ids_kimi_keeps_the_models_and_mistral_gets_nine_letters_and_digits():
    (kimi,) = tc.parse(tc.KIMI_K2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
                                   '<|tool_call_argument_begin|>{"zone": "UTC"}<|tool_call_end|>'
                                   "<|tool_calls_section_end|>")[1]
    assert (kimi.name, kimi.id) == ("get_time", "functions.get_time:0")
    (mistral,) = tc.parse(tc.MISTRAL, '[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}')[1]
    assert len(mistral.id) == 9 and mistral.id.isalnum()
    (given,) = tc.parse(tc.MISTRAL, '[TOOL_CALLS][{"name": "get_time", "arguments": {}, "id": "a1b2c3d4e"}]')[1]
    assert given.id == "a1b2c3d4e"
    (hermes,) = tc.parse(tc.HERMES, '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>')[1]
    assert hermes.id.startswith("call_")


def test_parse_never_raises_on_broken_or_hostile_output():
    rng = random.Random(26)
    for family, samples in SAMPLES.items():
        for sample in samples:
            for _ in range(60):
                a, b = sorted(rng.randrange(len(sample) + 1) for _ in range(2))
                tc.parse(family, sample[a:b], TOOLS)  # a cut anywhere: content or calls, never an error
                tc.parse(family, sample[:a] + sample[b:] + sample[a:b], TOOLS)
        tc.parse(family, tc.start_marker(family) + "[" * 100_000, TOOLS)


def test_unknown_family_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown tool-call family"):
        tc.parse("nope", "")


# -- streaming ----------------------------------------------------------------------------------

def test_held_back_is_the_tail_that_could_begin_the_marker():
    assert tc.held_back("Sure <tool", "<tool_call>") == 5
    assert tc.held_back("Sure <", "<tool_call>") == 1
    assert tc.held_back("Sure", "<tool_call>") == 0
    assert tc.held_back("a <tool_call", "<tool_call>") == 10
    assert tc.held_back("", "<tool_call>") == 0


@pytest.mark.parametrize("family", tc.FAMILIES)
def test_every_call_begins_with_its_start_marker(family):
    for sample in SAMPLES[family]:
        assert sample.startswith(tc.start_marker(family))


# -- forced-call grammars -------------------------------------------------------------------------

# Hand-written strings each grammar allows (checked by llama.cpp below) and what they read back as.
SAMPLES = {
    tc.HERMES: ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>',
                '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'],
    tc.QWEN3_XML: ["<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
                   "</parameter>\n</function>\n</tool_call>",
                   "<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n</parameter>\n</function>\n</tool_call>"],
    tc.GLM45: ["<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n"
               "<arg_value>2</arg_value>\n</tool_call>",
               "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC</arg_value>\n</tool_call>"],
    tc.HY3: ["<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city"
             "</arg_key:opensource>\n<arg_value:opensource>Oslo</arg_value:opensource>\n<arg_key:opensource>days"
             "</arg_key:opensource>\n<arg_value:opensource>2</arg_value:opensource>\n</tool_call:opensource>\n"
             "</tool_calls:opensource>",
             "<tool_calls:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n<arg_key:opensource>zone"
             "</arg_key:opensource>\n<arg_value:opensource>UTC</arg_value:opensource>\n</tool_call:opensource>\n"
             "</tool_calls:opensource>"],
    tc.DEEPSEEK_V3: ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                     '{"city": "Oslo", "days": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
                     '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "UTC"}'
                     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    tc.DSML: ['<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
              'string="true">Oslo</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2'
              "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
              '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="zone" string="true">UTC'
              "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"],
    tc.MISTRAL: ['[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}',
                 '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": "UTC"}}]'],
    tc.LLAMA3: ['{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}',
                '{"name": "get_time", "parameters": {"zone": "UTC"}}'],
    tc.KIMI_K2: ['<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
                 '{"city": "Oslo", "days": 2}<|tool_call_end|><|tool_calls_section_end|>',
                 "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>"
                 '{"zone": "UTC"}<|tool_call_end|><|tool_calls_section_end|>'],
    tc.MINIMAX_M2: ['<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n'
                    '<parameter name="days">2</parameter>\n</invoke>\n</minimax:tool_call>',
                    '<minimax:tool_call>\n<invoke name="get_time">\n<parameter name="zone">UTC</parameter>\n</invoke>\n'
                    "</minimax:tool_call>"],
}
READ_BACK = [("get_weather", {"city": "Oslo", "days": 2}), TIME_UTC]


@pytest.mark.parametrize("family", tc.FAMILIES)
def test_what_each_grammar_allows_parses_back(family):
    for sample, expected in zip(SAMPLES[family], READ_BACK, strict=True):
        content, calls = tc.parse(family, sample, TOOLS)
        assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [expected]


def test_a_grammar_names_only_the_tools_or_the_one_asked_for():
    grammar = tc.forced_call_grammar(tc.HERMES, TOOLS)
    assert '\\"get_weather\\"' in grammar and '\\"get_time\\"' in grammar
    only = tc.forced_call_grammar(tc.HERMES, TOOLS, name="get_time")
    assert "get_weather" not in only and "get_time" in only
    assert '"<parameter=" "zone"' in tc.forced_call_grammar(tc.QWEN3_XML, TOOLS, name="get_time")
    with pytest.raises(ValueError, match="at least one function"):
        tc.forced_call_grammar(tc.HERMES, [])


@pytest.fixture(scope="module")
def llama() -> Any:
    from engine.runtime.native import llama

    return llama()


@pytest.mark.parametrize("family", tc.FAMILIES)
def test_every_grammar_is_valid_gbnf_for_llama_cpp(llama, family):
    free = [{"type": "function", "function": {"name": "free"}}]  # no parameters listed: any names
    for tools, name in ((TOOLS, None), (TOOLS, "get_time"), (free, None)):
        stage = llama.llama_sampler_init_grammar(None, tc.forced_call_grammar(family, tools, name).encode(), b"root")
        assert stage, f"llama.cpp refused the {family} grammar"
        llama.llama_sampler_free(stage)


@pytest.fixture(scope="module")
def vocab_model(default_model: Path) -> Iterator[Any]:
    from engine.runtime.model import Model

    with Model(default_model) as model:
        yield model


@pytest.fixture(scope="module")
def byte_tokens(vocab_model: Any) -> list[int]:
    """The built-in model's byte-fallback tokens (``<0x00>`` … ``<0xFF>``), by byte."""
    found = {}
    for token in range(vocab_model.n_vocab):
        text = vocab_model.token_text(token)
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            found[int(text[3:5], 16)] = token
    assert len(found) == 256
    return [found[b] for b in range(256)]


def _grammar_takes(llama: Any, model: Any, byte_tokens: list[int], grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler lets ``text`` through, then the end of the reply.

    The text goes in byte by byte, as the vocabulary's byte tokens, so the check does not hang on
    how this vocabulary splits text (Gemma's reads DeepSeek's "▁" as a space)."""
    stage = llama.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root")
    assert stage
    try:
        for token in [*(byte_tokens[b] for b in text.encode()), model.eos]:
            data = (llama.llama_token_data * 1)()
            data[0].id, data[0].logit, data[0].p = token, 0.0, 0.0
            candidates = llama.llama_token_data_array(data, 1, -1, False)
            llama.llama_sampler_apply(stage, ctypes.byref(candidates))
            if data[0].logit == float("-inf"):
                return False
            if token != model.eos:
                llama.llama_sampler_accept(stage, token)
        return True
    finally:
        llama.llama_sampler_free(stage)


@pytest.mark.parametrize("family", tc.FAMILIES)
def test_llama_cpp_takes_the_samples_and_refuses_other_names(llama, vocab_model, byte_tokens, family):
    def takes(grammar: str, text: str) -> bool:
        return _grammar_takes(llama, vocab_model, byte_tokens, grammar, text)

    grammar = tc.forced_call_grammar(family, TOOLS)
    for sample in SAMPLES[family]:
        assert takes(grammar, sample), sample
    weather, time = SAMPLES[family]
    only_time = tc.forced_call_grammar(family, TOOLS, name="get_time")
    assert takes(only_time, time)
    assert not takes(only_time, weather)
    assert not takes(grammar, weather.replace("get_weather", "get_stock"))
    assert not takes(grammar, weather[:-1])
    assert not takes(grammar, "Sure! " + weather)


PICK = [{"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"color": {"type": "string", "enum": ["red", "blue"]}, "n": {"type": "integer"}},
    "required": ["color"]}}}]
PICKED = {
    tc.HERMES: ('<tool_call>\n{"name": "pick", "arguments": {"color": "red", "n": 2}}\n</tool_call>',
                '<tool_call>\n{"name": "pick", "arguments": {"n": 2}}\n</tool_call>'),
    tc.QWEN3_XML: ("<tool_call>\n<function=pick>\n<parameter=color>\nred\n</parameter>\n"
                   "<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>",
                   "<tool_call>\n<function=pick>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>"),
    tc.DSML: ('<｜DSML｜function_calls>\n<｜DSML｜invoke name="pick">\n'
              '<｜DSML｜parameter name="color" string="true">red</｜DSML｜parameter>\n'
              '<｜DSML｜parameter name="n" string="false">2</｜DSML｜parameter>\n'
              "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
              '<｜DSML｜function_calls>\n<｜DSML｜invoke name="pick">\n'
              '<｜DSML｜parameter name="n" string="false">2</｜DSML｜parameter>\n'
              "</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
}


@pytest.mark.parametrize("family", sorted(PICKED))
def test_forced_arguments_follow_the_functions_schema(llama, vocab_model, byte_tokens, family):
    def takes(text: str) -> bool:
        return _grammar_takes(llama, vocab_model, byte_tokens, tc.forced_call_grammar(family, PICK), text)

    good, without_required = PICKED[family]
    assert takes(good) and tc.parse(family, good, PICK)[1][0].arguments == '{"color":"red","n":2}'
    assert not takes(good.replace("red", "green"))  # not in the enum
    assert not takes(good.replace("2", "two"))  # not an integer
    assert not takes(without_required)


def test_a_schema_llama_cpp_cannot_express_allows_any_arguments(llama):
    remote = [{"type": "function", "function": {"name": "fetch", "parameters": {
        "type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}, "b": {"type": "integer"}}}}}]
    for family in tc.FAMILIES:
        stage = llama.llama_sampler_init_grammar(None, tc.forced_call_grammar(family, remote).encode(), b"root")
        assert stage, family
        llama.llama_sampler_free(stage)


def test_an_xml_grammar_names_only_the_declared_parameters(llama, vocab_model, byte_tokens):
    grammar = tc.forced_call_grammar(tc.QWEN3_XML, TOOLS)
    weather = SAMPLES[tc.QWEN3_XML][0].replace("=city>", "=town>")
    assert not _grammar_takes(llama, vocab_model, byte_tokens, grammar, weather)
    free = tc.forced_call_grammar(tc.QWEN3_XML, [{"type": "function", "function": {"name": "get_weather"}}])
    assert _grammar_takes(llama, vocab_model, byte_tokens, free, weather)


WRITE = [{"type": "function", "function": {"name": "write", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
    "required": ["path", "text"]}}}]
CODE = 'if (a < b && c<<2 > 1) { cout << "<div>" << x; } // </param <parameter x'
WRITTEN = {
    tc.QWEN3_XML: lambda text: ("<tool_call>\n<function=write>\n<parameter=path>\na.cc\n</parameter>\n"
                                f"<parameter=text>\n{text}\n</parameter>\n</function>\n</tool_call>"),
    tc.GLM45: lambda text: ("<tool_call>write\n<arg_key>path</arg_key>\n<arg_value>a.cc</arg_value>\n"
                            f"<arg_key>text</arg_key>\n<arg_value>{text}</arg_value>\n</tool_call>"),
    tc.MINIMAX_M2: lambda text: ('<minimax:tool_call>\n<invoke name="write">\n<parameter name="path">a.cc</parameter>\n'
                                 f'<parameter name="text">{text}</parameter>\n</invoke>\n</minimax:tool_call>'),
}


@pytest.mark.parametrize("family", sorted(WRITTEN))
def test_an_xml_text_value_may_hold_code_but_not_the_tag_that_ends_it(llama, vocab_model, byte_tokens, family):
    # agents pass code through tool calls: '<', '<<' and tags are text; only the closing tag is not
    grammar = tc.forced_call_grammar(family, WRITE)
    call = WRITTEN[family](CODE)
    assert _grammar_takes(llama, vocab_model, byte_tokens, grammar, call)
    assert json.loads(tc.parse(family, call, WRITE)[1][0].arguments)["text"] == CODE
    closing = {tc.QWEN3_XML: "</parameter>", tc.GLM45: "</arg_value>", tc.MINIMAX_M2: "</parameter>"}[family]
    assert not _grammar_takes(llama, vocab_model, byte_tokens, grammar,
                              WRITTEN[family](f"a {closing} b"))


@pytest.mark.parametrize("family", [tc.HERMES, tc.QWEN3_XML, tc.GLM45])
def test_the_auto_grammar_allows_one_call_or_several_and_is_triggered_by_the_marker(llama, vocab_model, byte_tokens,
                                                                                    family):
    grammar, triggers = tc.auto_call_grammar(family, TOOLS)
    (trigger,) = triggers  # a regular expression matching the family's call marker literally
    assert re.fullmatch(trigger, tc.start_marker(family)) and not re.fullmatch(trigger, "<tool_callx")
    weather, time = SAMPLES[family]
    assert _grammar_takes(llama, vocab_model, byte_tokens, grammar, weather)
    assert _grammar_takes(llama, vocab_model, byte_tokens, grammar, weather + "\n" + time)
    assert not _grammar_takes(llama, vocab_model, byte_tokens, grammar, weather.replace("get_weather", "get_stock"))
    assert tc.auto_call_grammar(tc.MISTRAL, TOOLS) is None  # calls in one block: left unconstrained

"""Tool calls in each model family's own syntax: which syntax a chat template teaches, the calls
read back out of a reply, and grammars that let a model write nothing but one well-formed call.

The model's template renders the tools and the call history (engine/generation/chat_template.py),
so the model answers in the syntax it was trained on and this module only has to read it. A family
is named after the models that brought it and is recognised by markers in the template's text, as
llama.cpp's common/chat.cpp does. Model output is never trusted: text that is not a well-formed
call stays content, and nothing here raises on it.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import GrammarError
from engine.generation import grammars


def call_id() -> str:
    """A tool call's id, unique enough for a client to pair the call with its result."""
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    """A function call the model made: its name and its arguments as JSON text (as OpenAI sends them)."""

    name: str
    arguments: str  # JSON object text
    id: str = field(default_factory=call_id)

QWEN3_XML = "qwen3_xml"  # Qwen3-Coder, Qwen3.5/3.6, Step 3.5 Flash, Nemotron 3 Nano
HERMES = "hermes"  # Qwen2.5, Qwen3, QwQ, Hermes 2/3, Granite 4, MiMo-VL, GENERIC_TEMPLATE
GLM45 = "glm45"  # GLM-4.5/4.6/4.7, Ling 3.0, Laguna, Spark 2.5
HY3 = "hy3"  # Hunyuan 3: GLM's syntax with ":opensource" tags and a separator after the name
DEEPSEEK_V3 = "deepseek_v3"  # DeepSeek V3, V3.1, R1 and its distills
DSML = "dsml"  # DeepSeek V3.2 and V4
MISTRAL = "mistral"  # Mistral Nemo, Small 3.2, Devstral, Ministral 3
LLAMA3 = "llama3"  # Llama 3.1/3.2/3.3
KIMI_K2 = "kimi_k2"  # Kimi K2 and K2 Thinking
MINIMAX_M2 = "minimax_m2"  # MiniMax-M2

# (family, markers its template's text holds, markers that rule it out): the first match wins,
# so a family whose markers another's include comes after that one.
_DETECTION: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    (KIMI_K2, ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), ()),
    (MINIMAX_M2, ("<minimax:tool_call>", "<invoke name="), ()),
    (DSML, ("dsml_token", "DSML", "invoke name="), ()),
    (HY3, (":opensource", "<tool_call{}>", "<arg_key{}>"), ()),
    (QWEN3_XML, ("<tool_call>", "<function=", "<parameter="), ()),
    (GLM45, ("<tool_call>", "<arg_key>", "<arg_value>"), ()),
    (DEEPSEEK_V3, ("tool▁calls▁begin", "tool▁sep"), ()),
    (MISTRAL, ("[TOOL_CALLS]",), ()),
    (HERMES, ("<tool_call>", "</tool_call>", '"name"'), ("]<]minimax[>[", "<tool_calls>")),
    (LLAMA3, ("<|start_header_id|>", '"parameters": '), ("<function=", "functools", ">>>")),
)

_START = {
    QWEN3_XML: "<tool_call>", HERMES: "<tool_call>", GLM45: "<tool_call>", HY3: "<tool_calls:opensource>",
    DEEPSEEK_V3: "<｜tool▁calls▁begin｜>", DSML: "<｜DSML｜", MISTRAL: "[TOOL_CALLS]", LLAMA3: '{"name"',
    KIMI_K2: "<|tool_calls_section_begin|>", MINIMAX_M2: "<minimax:tool_call>",
}
FAMILIES = tuple(_START)

Span = tuple[int, int, list[ToolCall]]  # the markup text[start:end] and the calls it spells
Types = dict[str, dict[str, Any]]  # function name -> parameter name -> the type its schema declares


def family_of(template_text: str | None) -> str | None:
    """The tool-call syntax a chat template teaches its model; None when it teaches none read here."""
    if not template_text:
        return None
    for family, markers, excluded in _DETECTION:
        if all(m in template_text for m in markers) and not any(m in template_text for m in excluded):
            return family
    return None


def start_marker(family: str) -> str:
    """The text that begins a call: a streaming server sends content until it appears.

    Llama 3 writes a bare JSON object, optionally after ``<|python_tag|>``; its marker is the
    object's start as the templates write it (``{"name"``).
    """
    return _START[_known(family)]


def held_back(text: str, marker: str) -> int:
    """How many of ``text``'s last characters could begin ``marker``, to hold back while streaming."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


def parse(family: str, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str, list[ToolCall]]:
    """The reply's content without its tool-call markup, and the calls in order.

    Args:
        family: one of :data:`FAMILIES` (from :func:`family_of`).
        text: the model's reply.
        tools: the request's tools, when known: an XML family's parameter that the schema declares
            a string keeps its text ("007" stays "007"); any other value is JSON when it reads as JSON.

    Returns:
        The content, trimmed around the calls taken out (untouched when there are none), and the
        calls, their arguments compact JSON object text. Markup that is no well-formed call stays.

    Raises:
        ValueError: ``family`` is unknown (never for anything in ``text``).
    """
    spans = _PARSERS[_known(family)](text, _declared_types(tools))
    if not spans:
        return text, []
    pieces, pos = [], 0
    for start, end, _ in spans:
        pieces.append(text[pos:start])
        pos = end
    pieces.append(text[pos:])
    return "\n".join(p.strip() for p in pieces if p.strip()), [c for _, _, calls in spans for c in calls]


def _known(family: str) -> str:
    if family not in _START:
        raise ValueError(f"unknown tool-call family {family!r}; expected one of {', '.join(FAMILIES)}")
    return family


# -- reading values -----------------------------------------------------------------------------

def _function_of(tool: Any) -> dict[str, Any] | None:
    """The ``function`` of an OpenAI tool (or the tool itself in the flat shape), if it names one."""
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    return function if isinstance(function, dict) and isinstance(function.get("name"), str) else None


def _properties(function: dict[str, Any]) -> dict[str, Any] | None:
    params = function.get("parameters")
    props = params.get("properties") if isinstance(params, dict) else None
    return props if isinstance(props, dict) else None


def _declared_types(tools: list[dict[str, Any]] | None) -> Types:
    out: Types = {}
    for function in filter(None, map(_function_of, tools or ())):
        props = _properties(function) or {}
        out[function["name"]] = {k: v.get("type") for k, v in props.items() if isinstance(v, dict)}
    return out


def _decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """The JSON value at ``text[pos:]`` and where it ends; ValueError when there is none (also for
    nesting too deep for the decoder, which a model can write)."""
    try:
        return _DECODER.raw_decode(text, pos)
    except RecursionError as exc:
        raise ValueError("JSON nested too deep") from exc


_DECODER = json.JSONDecoder()


def _whole_json(text: str) -> Any:
    """The JSON value ``text`` holds, whitespace aside; ValueError when it holds more or less."""
    value, end = _decode(text.strip())
    if text.strip()[end:].strip():
        raise ValueError("text after the JSON value")
    return value


def _value(text: str, declared: Any) -> Any:
    """An XML parameter's value: its text for a declared string, else JSON when it reads as JSON."""
    if declared in ("string", ["string"]):
        return text
    try:
        return _whole_json(text)
    except ValueError:
        return text


def _call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> ToolCall:
    text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return ToolCall(name.strip(), text, call_id) if call_id else ToolCall(name.strip(), text)


def _json_call(name: Any, arguments: Any, call_id: Any = None) -> ToolCall | None:
    """A call from JSON parts: None unless the name is text and the arguments an object, its JSON
    text, or absent."""
    if isinstance(arguments, str):
        try:
            arguments = _whole_json(arguments)
        except ValueError:
            return None
    arguments = {} if arguments is None else arguments
    if not isinstance(name, str) or not name.strip() or not isinstance(arguments, dict):
        return None
    return _call(name, arguments, call_id if isinstance(call_id, str) else None)


def _spans(text: str, opening: str, closing: str, read: Callable[[str], list[ToolCall] | None]) -> list[Span]:
    """Each ``opening … closing`` block (regular expressions) that ``read`` finds calls in; the last
    block may lack its closing when the reply ends inside it."""
    spans = []
    for block in re.finditer(f"(?:{opening})(.*?)(?:{closing}|\\Z)", text, re.S):
        calls = read(block.group(1))
        if calls:
            spans.append((block.start(), block.end(), calls))
    return spans


def _each(pattern: re.Pattern[str], body: str, read: Callable[[re.Match[str]], ToolCall | None]
          ) -> list[ToolCall] | None:
    """The calls ``pattern`` finds in ``body``: None unless there is one, each reads, and only
    whitespace lies between them."""
    calls = [read(m) for m in pattern.finditer(body)]
    if not calls or pattern.sub("", body).strip():
        return None
    return [c for c in calls if c is not None] if None not in calls else None


# -- the families -------------------------------------------------------------------------------

def _hermes(text: str, types: Types) -> list[Span]:
    def read(body: str) -> list[ToolCall] | None:
        try:
            obj = _whole_json(body)
        except ValueError:
            return None
        call = _json_call(obj.get("name"), obj.get("arguments", obj.get("parameters"))) \
            if isinstance(obj, dict) else None
        return [call] if call else None

    return _spans(text, "<tool_call>", "</tool_call>", read)


_QWEN_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.S)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)


def _qwen3_xml(text: str, types: Types) -> list[Span]:
    """Values sit on lines of their own; a missing ``</parameter>`` (Qwen3.5 drops some) ends at the
    next parameter."""
    def read_function(m: re.Match[str]) -> ToolCall | None:
        name, body = m.group(1).strip(), m.group(2)
        if not name or _QWEN_PARAMETER.sub("", body).strip():
            return None
        declared, args = types.get(name, {}), {}
        for p in _QWEN_PARAMETER.finditer(body):
            key = p.group(1).strip()
            args[key] = _value(_one_newline_off(p.group(2)), declared.get(key))
        return _call(name, args)

    return _spans(text, "<tool_call>", "</tool_call>", lambda body: _each(_QWEN_FUNCTION, body, read_function))


def _one_newline_off(value: str) -> str:
    """The value less the newline the template writes on each side of it."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _tagged_pairs(suffix: str, wrapped: bool) -> Callable[[str, Types], list[Span]]:
    """GLM's ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>``; Hunyuan 3
    adds ``suffix`` to every tag, a ``<tool_sep>`` after the name and ``<tool_calls>`` around."""
    tag = {t: re.escape(f"<{t}{suffix}>") for t in ("tool_calls", "/tool_calls", "tool_call", "/tool_call",
                                                   "tool_sep", "arg_key", "/arg_key", "arg_value", "/arg_value")}
    call_re = re.compile(f"{tag['tool_call']}(.*?){tag['/tool_call']}", re.S)
    pair = re.compile(f"{tag['arg_key']}(.*?){tag['/arg_key']}\\s*{tag['arg_value']}(.*?){tag['/arg_value']}", re.S)

    def spans(text: str, types: Types) -> list[Span]:
        def read_call(body: str) -> ToolCall | None:
            head = re.split(tag["arg_key"], body, maxsplit=1)[0]
            name, pairs = re.sub(tag["tool_sep"], "", head).strip(), body[len(head):]
            if not name or "<" in name or "\n" in name or pair.sub("", pairs).strip():
                return None
            declared = types.get(name, {})
            return _call(name, {k.strip(): _value(v, declared.get(k.strip())) for k, v in pair.findall(pairs)})

        if wrapped:
            return _spans(text, tag["tool_calls"], tag["/tool_calls"],
                          lambda body: _each(call_re, body, lambda m: read_call(m.group(1))))
        return _spans(text, tag["tool_call"], tag["/tool_call"], lambda body: _listed(read_call(body)))

    return spans


def _listed(call: ToolCall | None) -> list[ToolCall] | None:
    return [call] if call else None


_DS = "<｜tool[▁_ ]{}[▁_ ]{}｜>"  # DeepSeek's special tokens; some exports spell ▁ as _ or a space
_DS_CALL = re.compile(f"{_DS.format('call', 'begin')}(.*?){_DS.format('call', 'end')}", re.S)
_DS_SEP = re.compile("<｜tool[▁_ ]sep｜>")


def _deepseek_v3(text: str, types: Types) -> list[Span]:
    def read_call(m: re.Match[str]) -> ToolCall | None:
        parts = _DS_SEP.split(m.group(1), maxsplit=1)
        if len(parts) != 2:
            return None
        left, right = parts
        if right.lstrip().startswith("{"):  # V3.1: NAME<sep>{…}
            name, arguments = left, right
        else:  # V3 and R1: function<sep>NAME\n```json\n{…}\n```
            name, _, arguments = right.partition("\n")
            arguments = re.sub(r"^\s*```(?:json)?|```\s*$", "", arguments.strip())
        try:
            return _json_call(name, _whole_json(arguments))
        except ValueError:
            return None

    return _spans(text, _DS.format("calls", "begin"), _DS.format("calls", "end"),
                  lambda body: _each(_DS_CALL, body, read_call))


def _invoke_xml(prefix: str, wrappers: tuple[str, ...], typed: bool) -> Callable[[str, Types], list[Span]]:
    """``<invoke name="N"><parameter name="K">V</parameter></invoke>`` inside one of ``wrappers``
    (MiniMax-M2), every tag opened by ``prefix`` (DeepSeek's DSML, whose ``string="true|false"``
    says whether a value is text or JSON)."""
    p, names = re.escape(prefix), "|".join(map(re.escape, wrappers))
    attribute = ' string="(true|false)"' if typed else "()"
    invoke = re.compile(f'<{p}invoke name="([^"]+)">(.*?)</{p}invoke>', re.S)
    param = re.compile(f'<{p}parameter name="([^"]+)"{attribute}>(.*?)</{p}parameter>', re.S)

    def spans(text: str, types: Types) -> list[Span]:
        def read_invoke(m: re.Match[str]) -> ToolCall | None:
            name, body = m.group(1).strip(), m.group(2)
            if param.sub("", body).strip():
                return None
            declared = types.get(name, {})
            return _call(name, {k: v if is_text == "true" else _value(v, declared.get(k))
                                for k, is_text, v in param.findall(body)})

        return _spans(text, f"<{p}(?:{names})>", f"</{p}(?:{names})>", lambda body: _each(invoke, body, read_invoke))

    return spans


def _mistral_id() -> str:
    """Mistral's templates refuse call ids other than 9 letters and digits, so a call without one
    from the model gets such an id."""
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


_MISTRAL_NAMED = re.compile(r"\s*([^\[\]\s{]+)(?:\[CALL_ID\]([A-Za-z0-9_-]*))?\[ARGS\]")


def _mistral(text: str, types: Types) -> list[Span]:
    """``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`` (Nemo) or ``[TOOL_CALLS]NAME[ARGS]{…}``
    (Small 3.2 adds ``[CALL_ID]ID`` before ``[ARGS]``; Devstral, Ministral 3)."""
    def ident(given: Any) -> str:
        return given if isinstance(given, str) and given else _mistral_id()

    spans: list[Span] = []
    for marker in re.finditer(re.escape("[TOOL_CALLS]"), text):
        at = _after_space(text, marker.end())
        try:
            if text.startswith(("[", "{"), at):
                items, end = _decode(text, at)
                calls = [_json_call(i.get("name"), i.get("arguments"), ident(i.get("id")))
                         if isinstance(i, dict) else None for i in (items if isinstance(items, list) else [items])]
            elif named := _MISTRAL_NAMED.match(text, marker.end()):
                arguments, end = _decode(text, named.end())
                calls = [_json_call(named.group(1), arguments, ident(named.group(2)))]
            else:
                continue
        except ValueError:
            continue
        if calls and None not in calls:
            spans.append((marker.start(), end, [c for c in calls if c]))
    return spans


_LLAMA_START = re.compile(r'<\|python_tag\|>|\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:')


def _after_space(text: str, pos: int, space: str = " \t\r\n") -> int:
    while pos < len(text) and text[pos] in space:
        pos += 1
    return pos


def _llama3(text: str, types: Types) -> list[Span]:
    """``{"name": N, "parameters": {…}}``, one or more (``;`` or whitespace between), optionally
    after ``<|python_tag|>``: the first such object starts the calls."""
    for start in _LLAMA_START.finditer(text):
        pos, calls = start.end() if start.group(0) == "<|python_tag|>" else start.start(), []
        while True:
            try:
                obj, end = _decode(text, _after_space(text, pos, " \t\r\n;"))
            except ValueError:
                break
            call = _json_call(obj.get("name"), obj.get("parameters", obj.get("arguments"))) \
                if isinstance(obj, dict) else None
            if call is None:
                break
            calls.append(call)
            pos = end
        if calls:
            return [(start.start(), pos, calls)]
    return []


_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*([^<]+?)\s*<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>",
                        re.S)


def _kimi_k2(text: str, types: Types) -> list[Span]:
    """The model's id for a call, ``functions.NAME:INDEX``, names the function and stays the call's
    id: Kimi's templates pair each result with its call by it."""
    def read_call(m: re.Match[str]) -> ToolCall | None:
        ident = m.group(1)
        try:
            return _json_call(re.sub(r":\d+$", "", ident.removeprefix("functions.")), _whole_json(m.group(2)), ident)
        except ValueError:
            return None

    return _spans(text, re.escape("<|tool_calls_section_begin|>"), re.escape("<|tool_calls_section_end|>"),
                  lambda body: _each(_KIMI_CALL, body, read_call))


_PARSERS: dict[str, Callable[[str, Types], list[Span]]] = {
    QWEN3_XML: _qwen3_xml,
    HERMES: _hermes,
    GLM45: _tagged_pairs("", wrapped=False),
    HY3: _tagged_pairs(":opensource", wrapped=True),
    DEEPSEEK_V3: _deepseek_v3,
    DSML: _invoke_xml("｜DSML｜", ("function_calls", "tool_calls"), typed=True),
    MISTRAL: _mistral,
    LLAMA3: _llama3,
    KIMI_K2: _kimi_k2,
    MINIMAX_M2: _invoke_xml("", ("minimax:tool_call",), typed=False),
}


# -- grammars that force one call ---------------------------------------------------------------

_FREE_PARAMETERS = 16  # the most parameters a forced call may write when its schema lists none
_XML_NAME = "[a-zA-Z_] [a-zA-Z0-9_.-]*"


@dataclass(frozen=True)
class _Function:
    name: str
    schema: dict[str, Any]  # its parameters' JSON schema ({}: any object)


def forced_call_grammar(family: str, tools: list[dict[str, Any]], name: str | None = None) -> str:
    """A GBNF grammar (llama.cpp's syntax, rule ``root``) whose every string is one well-formed call.

    For ``tool_choice: "required"`` or a named function: even a model that would never call a tool
    then writes one that :func:`parse` reads. The function is one of ``tools`` (exactly ``name`` when
    given), and its arguments follow its parameters' schema (llama.cpp's JSON-schema conversion,
    engine/generation/grammars.py): a JSON family's as one object; an XML family's one parameter
    each, in the schema's order, the required ones always, a string's value as text without ``<``
    and any other as JSON. A schema the conversion cannot express allows any object (any values).

    Raises:
        ValueError: an unknown family, or no function to call.
    """
    _known(family)
    functions = [_Function(f["name"], p if isinstance(p := f.get("parameters"), dict) else {})
                 for f in filter(None, map(_function_of, tools))]
    if name is not None:
        functions = [f for f in functions if f.name == name] or [_Function(name, {})]
    if not functions:
        raise ValueError("a forced tool call needs at least one function tool to call")
    rules = grammars.SchemaRules()
    rules.rule("root", " | ".join(_GRAMMARS[family](rules, i, f) for i, f in enumerate(functions)))
    return rules.text() + "\n"


# Families whose calls are self-contained blocks, one after another: a reply may hold several.
_REPEATABLE = (HERMES, QWEN3_XML, GLM45)


def auto_call_grammar(family: str, tools: list[dict[str, Any]]) -> tuple[str, list[str]] | None:
    """For ``tool_choice: "auto"``: a *lazy* grammar and the patterns that trigger it.

    The model writes freely until it begins a call (the family's start marker); from there on
    llama.cpp's lazy grammar holds it to well-formed calls of the given tools, one or more, so a
    call it starts always parses. None for the families whose calls share one outer block (the
    reply stays unconstrained there; :func:`parse` still reads what the model writes).
    """
    if family not in _REPEATABLE:
        return None
    functions = [_Function(f["name"], p if isinstance(p := f.get("parameters"), dict) else {})
                 for f in filter(None, map(_function_of, tools))]
    if not functions:
        return None
    rules = grammars.SchemaRules()
    call = rules.rule("call", " | ".join(_GRAMMARS[family](rules, i, f) for i, f in enumerate(functions)))
    rules.rule("root", f'{call} ("\\n" {call})*')
    return rules.text() + "\n", [_regex_literal(_START[family])]


def _regex_literal(text: str) -> str:
    """``text`` as a regular expression matching it literally (ECMAScript, as llama.cpp compiles it)."""
    return "".join("\\" + c if c in "\\^$.|?*+()[]{}" else c for c in text)


def _lit(text: str) -> str:
    """``text`` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def _converts(schema: dict[str, Any]) -> bool:
    """Whether llama.cpp's conversion can express ``schema``; tried on rules of its own, since a
    conversion that fails leaves the rules it made so far behind."""
    try:
        grammars.SchemaRules().schema(schema, "trial")
    except GrammarError:
        return False
    return True


def _schema_rule(rules: grammars.SchemaRules, schema: dict[str, Any], name: str) -> str:
    """The rule of JSON text that follows ``schema``; of any JSON object when it cannot be expressed."""
    return rules.schema(schema if _converts(schema) else {}, name)


# A family's grammar: the alternatives of ``root`` that call the i-th function, and the rules they use.
Alternatives = Callable[[grammars.SchemaRules, int, _Function], str]


def _json_family(*forms: Callable[[str, str], str]) -> Alternatives:
    """A family whose arguments are one JSON object: each of ``forms(name, arguments_rule)``."""
    def alternatives(rules: grammars.SchemaRules, i: int, f: _Function) -> str:
        arguments = _schema_rule(rules, f.schema, f"fn{i}-args")
        return " | ".join(form(f.name, arguments) for form in forms)
    return alternatives


# A parameter's GBNF from (the rule of its name, the rule of its value, whether the value is text)
XmlParam = Callable[[str, str, bool], str]


def _text_without(rules: grammars.SchemaRules, words: tuple[str, ...]) -> str:
    """The rule of any text holding none of ``words`` (the tags that would end a value early).

    Code is what agents pass most (``if a < b``, ``cout << x``, ``<div>``), so a text value may hold
    ``<`` and anything else except a tag that ends it. The rule is the automaton of that language:
    one rule per prefix of a word read so far (as Aho-Corasick's), and every state may end.
    """
    prefixes = sorted({w[:k] for w in words for k in range(len(w))}, key=lambda p: (len(p), p))
    alphabet = sorted({c for w in words for c in w})

    def state(text: str) -> str | None:
        """The longest suffix of ``text`` that begins a word; None when ``text`` ends with a word."""
        if any(text.endswith(w) for w in words):
            return None
        return next(text[k:] for k in range(len(text) + 1) if text[k:] in prefixes)

    tag = hashlib.sha1("\0".join(words).encode()).hexdigest()[:6]
    names = {p: f"text-{tag}-{k}" for k, p in enumerate(prefixes)}
    for prefix in prefixes:
        moves = {c: state(prefix + c) for c in alphabet}
        special = sorted(c for c, after in moves.items() if after != "")  # a longer prefix, or a whole word
        others = f"[^{''.join(_class_char(c) for c in special)}]" if special else "[^\\x00]"
        alternatives = [f"{others} {names['']}"]
        alternatives += [f"{_lit(c)} {names[after]}" for c, after in moves.items() if after]
        rules.rule(names[prefix], f"( {' | '.join(alternatives)} )?")
    return names[""]


def _class_char(c: str) -> str:
    """``c`` inside a GBNF character class."""
    return {"\\": "\\\\", "]": "\\]", "[": "\\[", "^": "\\^", "-": "\\-", "\n": "\\n"}.get(c, c)


def _xml_family(wrapper: Callable[[str], tuple[str, str]], param: XmlParam, *more: Callable[[str], tuple[str, str]],
                ends: tuple[str, ...]) -> Alternatives:
    """A family with one tag per parameter: ``wrapper(name)`` (opening, closing) around them, or
    any of ``more`` wrappers; a text value holds none of the tags in ``ends`` (its parser would end
    the value, or the call, there)."""
    def alternatives(rules: grammars.SchemaRules, i: int, f: _Function) -> str:
        text_value = _text_without(rules, ends)
        props = f.schema.get("properties")
        if not isinstance(props, dict):  # no parameters listed: any names, any values
            free = rules.rule(f"fn{i}-param", param(rules.rule("xml-name", _XML_NAME), text_value, True))
            body = [f"{free}{{0,{_FREE_PARAMETERS}}}"]
        else:
            listed = f.schema.get("required")
            required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
            body = []
            for k, (key, schema) in enumerate(props.items()):
                value, text = _xml_value(rules, schema, f"fn{i}-p{k}", text_value)
                one = rules.rule(f"fn{i}-p{k}-param", param(_lit(str(key)), value, text))
                body.append(one if key in required else f"{one}?")
        return " | ".join(_seq(_lit(opening), *body, _lit(closing)) for opening, closing in
                          (w(f.name) for w in (wrapper, *more)))
    return alternatives


def _xml_value(rules: grammars.SchemaRules, schema: Any, name: str, text_value: str) -> tuple[str, bool]:
    """A parameter value's rule, and whether it is text (a string, ``text_value``'s rule) rather than JSON."""
    if not isinstance(schema, dict):
        return text_value, True
    kind, enum = schema.get("type"), schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum) and kind in (None, "string"):
        return rules.rule(name, " | ".join(_lit(v) for v in enum)), True
    if kind == "string" or (isinstance(kind, list) and "string" in kind) or (kind is None and enum is None
                                                                            and "const" not in schema):
        return text_value, True
    if not _converts(schema):
        return text_value, True
    return rules.schema(schema, name), False


def _seq(*parts: str) -> str:
    return " ".join(parts)


_DS_BEGIN = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
_DS_END = "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"

_GRAMMARS: dict[str, Alternatives] = {
    HERMES: _json_family(lambda n, args: _seq(
        _lit('<tool_call>\n{"name": ' + json.dumps(n) + ', "arguments": '), args, _lit("}\n</tool_call>"))),
    LLAMA3: _json_family(lambda n, args: _seq(_lit('{"name": ' + json.dumps(n) + ', "parameters": '), args, _lit("}"))),
    MISTRAL: _json_family(  # both syntaxes: the model writes the one it was trained on
        lambda n, args: _seq(_lit(f"[TOOL_CALLS]{n}[ARGS]"), args),
        lambda n, args: _seq(_lit('[TOOL_CALLS][{"name": ' + json.dumps(n) + ', "arguments": '), args, _lit("}]"))),
    DEEPSEEK_V3: _json_family(  # both syntaxes: V3 and R1's fenced JSON, and V3.1's
        lambda n, args: _seq(_lit(f"{_DS_BEGIN}function<｜tool▁sep｜>{n}\n```json\n"), args, _lit(f"\n```{_DS_END}")),
        lambda n, args: _seq(_lit(f"{_DS_BEGIN}{n}<｜tool▁sep｜>"), args, _lit(_DS_END))),
    KIMI_K2: _json_family(lambda n, args: _seq(
        _lit(f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{n}:0<|tool_call_argument_begin|>"), args,
        _lit("<|tool_call_end|><|tool_calls_section_end|>"))),
    QWEN3_XML: _xml_family(
        lambda n: (f"<tool_call>\n<function={n}>\n", "</function>\n</tool_call>"),
        lambda key, value, text: _seq(_lit("<parameter="), key, _lit(">\n"), value, _lit("\n</parameter>\n")),
        ends=("</parameter>", "<parameter=", "</function>")),
    GLM45: _xml_family(
        lambda n: (f"<tool_call>{n}\n", "</tool_call>"),  # GLM-4.7 leaves out the newline; the parser reads both
        lambda key, value, text: _seq(_lit("<arg_key>"), key, _lit("</arg_key>\n<arg_value>"), value,
                                      _lit("</arg_value>\n")),
        ends=("</arg_value>", "</tool_call>")),
    HY3: _xml_family(
        lambda n: (f"<tool_calls:opensource>\n<tool_call:opensource>{n}<tool_sep:opensource>\n",
                   "</tool_call:opensource>\n</tool_calls:opensource>"),
        lambda key, value, text: _seq(_lit("<arg_key:opensource>"), key,
                                      _lit("</arg_key:opensource>\n<arg_value:opensource>"), value,
                                      _lit("</arg_value:opensource>\n")),
        ends=("</arg_value:opensource>", "</tool_call:opensource>")),
    MINIMAX_M2: _xml_family(
        lambda n: (f'<minimax:tool_call>\n<invoke name="{n}">\n', "</invoke>\n</minimax:tool_call>"),
        lambda key, value, text: _seq(_lit('<parameter name="'), key, _lit('">'), value, _lit("</parameter>\n")),
        ends=("</parameter>", "</invoke>")),
    DSML: _xml_family(  # V3.2 writes function_calls, V4 tool_calls
        lambda n: (f'<｜DSML｜function_calls>\n<｜DSML｜invoke name="{n}">\n',
                   "</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
        lambda key, value, text: _seq(_lit('<｜DSML｜parameter name="'), key,
                                      _lit(f'" string="{"true" if text else "false"}">'), value,
                                      _lit("</｜DSML｜parameter>\n")),
        lambda n: (f'<｜DSML｜tool_calls>\n<｜DSML｜invoke name="{n}">\n', "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"),
        ends=("</｜DSML｜parameter>", "</｜DSML｜invoke>")),
}

"""Render chat messages into a prompt with the GGUF's own chat template.

Templates come from model files, i.e. from strangers, so they run in Jinja's
sandbox, and within limits the sandbox alone does not set: a time limit
(a loop nested three deep would otherwise render for ever, with the worker
deaf to ``cancel``), a size limit on the text it builds (``'x' * 10**10``
would otherwise exhaust memory), and a stop callback checked as it runs, so
a cancelled request stops rendering too. The checks sit in the sandbox's
hooks: every call, attribute, item and operator, and every loop iteration
and frame (the compiled template calls :meth:`_Limits.tick` there).

Tool calling: the OpenAI ``tools`` reach the template as ``tools``, and
messages may carry ``tool_calls`` (assistant) and ``tool_call_id`` / ``name``
(role ``tool``). The environment gives templates what Hugging Face's and
llama.cpp's renderers give them (``tojson`` with its keyword arguments,
``raise_exception``, ``strftime_now``, ``break``/``continue``, ``append`` on
the template's own lists, ``{% generation %}``), so the real templates models
ship render as their authors tested them; and, as llama.cpp's renderer, a
missing key of a missing key is missing rather than an error (Command R+
reads ``additionalProperties`` of every object parameter).

A model without a template (like the embedded Gemma 3 270M base model) gets
plain completion: the conversation's text, in order, for the model to
continue. The result says which was used so the UI can be honest.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from engine.errors import TemplateError

COMPLETION = "completion"
TEMPLATE = "template"

TIME_LIMIT_S = 3.0  # real templates render in milliseconds
MAX_CHARS = 4_000_000  # the longest text a template may build, unless the caller says less
MAX_RANGE = 100_000  # items in one range(); as jinja2's sandbox
MAX_EXPONENT = 4096  # in x ** n
MAX_INDENT = 64  # tojson(indent=n): every line of the JSON carries it
# list methods a template may call: only on its own copies (render deep-copies what it passes in)
_LIST_MUTATORS = frozenset({"append", "pop", "extend", "insert"})
# a width or precision in a format string: "%0*d", "%10000d", "{:>10000}"
_FORMAT_WIDTHS = re.compile(r"%[-#0 +]*(\d+)?(?:\.(\d+))?|\{[^{}]*?:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")


# llama-server's fallback for a model without a template: ChatML, with tools as Hermes 2 Pro and
# Qwen 2.5 write them (engine/generation/tool_calls.py reads its calls as the "hermes" family).
GENERIC_TEMPLATE = """\
{%- set first_system = messages and messages[0].role == 'system' %}
{%- set system = messages[0].content if first_system and messages[0].content is string else '' %}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if system %}
        {{- system + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within '
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
        '<args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif first_system %}
    {{- '<|im_start|>system\n' + system + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- for call in message.tool_calls or [] %}
            {%- set function = call.function if call.function is defined else call %}
            {%- set arguments = function.arguments if function.arguments is string else function.arguments | tojson %}
            {%- if content or not loop.first %}
                {{- '\n' }}
            {%- endif %}
            {{- '<tool_call>\n{"name": ' + function.name | tojson + ', "arguments": ' + arguments + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


class RenderCancelled(Exception):
    """Rendering stopped because the request was cancelled (not an error)."""


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # Qwen3/3.5, QwQ, DeepSeek R1, GLM 4.5+, MiniMax M2, Step 3.5


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    mode: str  # TEMPLATE or COMPLETION
    # True when the rendered text already starts with BOS, so tokenization must not add another.
    has_bos: bool

    @property
    def opens_thinking(self) -> bool:
        """Does the prompt end inside a thinking block its template opened (Qwen3.5's generation
        prompt ends with ``<think>``)? Then the reply begins with reasoning."""
        at = self.text.rfind(THINK_OPEN)
        return self.mode == TEMPLATE and at >= 0 and THINK_CLOSE not in self.text[at:]


def _raise(message: str) -> None:
    raise TemplateError(f"The model's chat template refused the conversation: {message}")


class _Limits:
    """The time, size and stop checks of one rendering."""

    def __init__(self, time_limit_s: float, max_chars: int, should_stop: Callable[[], bool]) -> None:
        self.time_limit_s = time_limit_s
        self.deadline = time.monotonic() + time_limit_s
        self.max_chars = max_chars
        self.should_stop = should_stop

    def tick(self) -> None:
        """Called at every loop iteration, call and lookup: stop on cancel or past the deadline."""
        if self.should_stop():
            raise RenderCancelled()
        if time.monotonic() > self.deadline:
            raise TemplateError(
                f"The model's chat template ran past its time limit ({self.time_limit_s:g} s) and was stopped; "
                "it may loop without end. Use a model with a working template, or send a plain prompt."
            )

    def too_big(self, size: int) -> None:
        if size > self.max_chars:
            raise TemplateError(
                f"The model's chat template tried to build text of {size:,} characters, over the size limit of "
                f"{self.max_chars:,}; it may be hostile or broken. Use a model with a working template, "
                "or send a plain prompt."
            )

    def check_size(self, value: Any) -> Any:
        """``value``, unless it is text or a sequence longer than the limit."""
        if isinstance(value, str | list | tuple | dict | bytes):
            self.too_big(len(value))
        return value

    def check_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse numbers that would only make sense as a size beyond the limit (``center(10**10)``)."""
        for arg in (*args, *kwargs.values()):
            if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > self.max_chars:
                self.too_big(abs(arg))

    def check_format(self, fmt: str) -> None:
        """Refuse a format string whose widths or precisions are beyond the limit (``'%09999999999d'``)."""
        for match in _FORMAT_WIDTHS.finditer(fmt):
            for number in match.groups():
                if number and (len(number) > 12 or int(number) > self.max_chars):
                    self.too_big(int(number[:13]))


def _binop_size(op: str, left: Any, right: Any) -> int:
    """The size of the result of ``left op right`` when it is text or a sequence, before computing it."""
    seq = (str, list, tuple)
    if op == "*":
        if isinstance(left, seq) and isinstance(right, int):
            return len(left) * max(right, 0)
        if isinstance(right, seq) and isinstance(left, int):
            return len(right) * max(left, 0)
    if op == "+" and isinstance(left, seq) and isinstance(right, seq):
        return len(left) + len(right)
    return 0


def _check_power(base: Any, exponent: Any) -> None:
    """``10 ** 10 ** 10`` would compute for hours inside one operation, where no deadline can reach it."""
    if isinstance(exponent, int) and abs(exponent) > MAX_EXPONENT and isinstance(base, int | float) \
            and abs(base) > 1:
        raise TemplateError(
            f"The model's chat template tried to raise a number to the power {exponent}, over the limit of "
            f"{MAX_EXPONENT}; it may be hostile or broken. Use a model with a working template."
        )


def _environment(limits: _Limits) -> Any:
    """A sandbox whose compiled templates call ``environment.tick()`` in every loop and frame."""
    from jinja2 import ChainableUndefined
    from jinja2.compiler import CodeGenerator
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
    from jinja2.utils import Namespace

    class GenerationTag(Extension):
        """Hugging Face's ``{% generation %}…{% endgeneration %}`` marks the assistant's text for
        training masks (LFM2.5, Laguna); for a prompt it is its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    class TickingCodeGenerator(CodeGenerator):
        def enter_frame(self, frame: Any) -> None:
            self.writeline("environment.tick()")  # each loop iteration, macro call, block
            super().enter_frame(frame)

        def visit_Concat(self, node: Any, frame: Any) -> None:  # the ~ operator
            self.write("environment.check_size(")
            super().visit_Concat(node, frame)
            self.write(")")

    class BoundedNamespace(Namespace):
        def __setitem__(self, name: str, value: Any) -> None:
            limits.tick()
            super().__setitem__(name, limits.check_size(value))

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        code_generator_class = TickingCodeGenerator
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def __init__(self) -> None:
            super().__init__(trim_blocks=True, lstrip_blocks=True, undefined=ChainableUndefined,
                             extensions=["jinja2.ext.loopcontrols", GenerationTag])
            self.tick = limits.tick
            self.check_size = limits.check_size
            self.filters["tojson"] = _tojson  # jinja2's own escapes <, >, & and ' for HTML
            self.filters = {name: _bounded_filter(name, f, limits) for name, f in self.filters.items()}
            self.globals.update(raise_exception=_raise, namespace=BoundedNamespace, range=self._range,
                                strftime_now=lambda fmt: datetime.datetime.now().strftime(fmt))

        def _range(self, *args: int) -> range:
            rng = range(*args)
            if len(rng) > MAX_RANGE:
                raise TemplateError(
                    f"The model's chat template asked for a range of {len(rng):,} items, over the limit of "
                    f"{MAX_RANGE:,}; it may be hostile or broken. Use a model with a working template."
                )
            return rng

        def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
            # Kimi K2's templates queue tool call ids with list.append and list.pop
            if isinstance(obj, list) and attr in _LIST_MUTATORS:
                return SandboxedEnvironment.is_safe_attribute(self, obj, attr, value)
            return bool(super().is_safe_attribute(obj, attr, value))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            limits.tick()
            limits.check_args(args, kwargs)
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, list) and getattr(__obj, "__name__", "") in ("append", "insert", "extend"):
                limits.too_big(len(owner) + (len(args[0]) if args and hasattr(args[0], "__len__") else 1))
            if isinstance(owner, str):  # a string method: 'x'.replace('x', 'y' * 999999) and the like
                name = getattr(__obj, "__name__", "")
                if name == "join" and args and not hasattr(args[0], "__len__"):
                    args = (list(args[0]), *args[1:])  # a generator: count it first
                limits.too_big(_grown_size(name, [owner, *args]))
            return limits.check_size(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj: Any, attribute: str) -> Any:
            limits.tick()
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                limits.check_format(obj)
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            limits.tick()
            if isinstance(obj, str) and argument in ("format", "format_map"):
                limits.check_format(obj)
            return super().getitem(obj, argument)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            limits.tick()
            limits.too_big(_binop_size(operator, left, right))
            if operator == "**":
                _check_power(left, right)
            if operator == "%" and isinstance(left, str):
                limits.check_format(left)
                limits.check_args(right if isinstance(right, tuple) else (right,), {})
            return limits.check_size(super().call_binop(context, operator, left, right))

    return BoundedEnvironment()


# jinja2 filters that return generators; the templates are written for minja, where they return lists
_LAZY_FILTERS = frozenset({"map", "select", "reject", "selectattr", "rejectattr", "batch", "slice"})


def _bounded_filter(name: str, func: Callable[..., Any], limits: _Limits) -> Callable[..., Any]:
    """``func`` with the limits checked on its arguments and its result."""

    @functools.wraps(func)  # keeps jinja's pass_context/pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        limits.tick()
        limits.check_args(args, kwargs)
        if name == "format" and args and isinstance(args[0], str):
            limits.check_format(args[0])
        if name == "join" and len(args) >= 2:  # (eval_ctx, value, d="", attribute=None)
            items = args[1] if hasattr(args[1], "__len__") else list(args[1])  # a generator: count it
            args = (args[0], items, *args[2:])
            sep = args[2] if len(args) > 2 else kwargs.get("d", "")
            limits.too_big(_grown_size("join", [sep, items]))
        if name == "replace" and len(args) >= 4:  # (eval_ctx, s, old, new, count=None)
            limits.too_big(_grown_size("replace", [str(args[1]), *args[2:4]]))
        result = func(*args, **kwargs)
        if name in _LAZY_FILTERS:  # a list, as llama.cpp's minja returns: printed, it is the items, not
            result = list(result)  # "<generator object sync_do_map at 0x…>" (llama-cpp-deepseek-r1 prints one)
        return limits.check_size(result)

    return bounded


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False,
            separators: tuple[str, str] | list[str] | None = None, sort_keys: bool = False) -> str:
    """JSON as Hugging Face's and llama.cpp's renderers write it: Python's spacing, non-ASCII kept.

    jinja2's own ``tojson`` escapes ``<``, ``>``, ``&`` and ``'`` for HTML, which would put
    ``\\u003c`` into prompts, and takes no ``ensure_ascii`` or ``separators``.
    """
    if isinstance(indent, int) and indent > MAX_INDENT:
        raise TemplateError(
            f"The model's chat template asked for JSON indented by {indent}, over the limit of {MAX_INDENT}; "
            "it may be hostile or broken. Use a model with a working template."
        )
    seps = (str(separators[0]), str(separators[1])) if separators is not None else None
    return json.dumps(value, indent=indent, ensure_ascii=bool(ensure_ascii), separators=seps,
                      sort_keys=bool(sort_keys), default=_json_default)


def _json_default(value: Any) -> Any:
    """An undefined variable is JSON null; anything else unknown is its text."""
    from jinja2 import Undefined

    return None if isinstance(value, Undefined) else str(value)


def _grown_size(name: str, values: list[Any]) -> int:
    """An upper bound on the length of ``values[0].name(*values[1:])`` for the string
    operations that multiply text without a size argument; 0 for the others."""
    if not values or not isinstance(values[0], str):
        return 0
    text, rest = values[0], values[1:]
    if name == "replace" and len(rest) >= 2 and isinstance(rest[0], str) and isinstance(rest[1], str):
        hits = text.count(rest[0]) if rest[0] else len(text) + 1
        return len(text) + hits * len(rest[1])
    if name == "join" and rest and hasattr(rest[0], "__len__"):
        return len(text) * len(rest[0]) + sum(len(v) for v in rest[0] if isinstance(v, str))
    if name == "expandtabs" and rest and isinstance(rest[0], int):
        return len(text) + text.count("\t") * rest[0]
    return 0


def _collect(pieces: Iterator[str], limits: _Limits) -> str:
    """Join the rendered pieces, stopping as soon as they pass the size limit."""
    out: list[str] = []
    total = 0
    for piece in pieces:
        total += len(piece)
        limits.too_big(total)
        out.append(piece)
    return "".join(out)


def _object_arguments(arguments: Any) -> dict[str, Any] | None:
    """The object a call's ``arguments`` JSON text spells, or None when it spells none."""
    if not isinstance(arguments, str):
        return None
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``function`` parts of a message's tool calls (OpenAI shape), the malformed ones left out."""
    calls = message.get("tool_calls") or []
    return [c["function"] for c in calls if isinstance(c, dict) and isinstance(c.get("function"), dict)]


def _template_messages(messages: list[dict[str, Any]], object_arguments: bool) -> list[dict[str, Any]]:
    """The messages as templates expect them, in a copy the template cannot reach the caller through.

    As llama.cpp gives them (common/chat.cpp): a message without content (an assistant's that only
    calls tools) has ``content: ""``, since templates concatenate it; and, for a template that takes
    them, a call's ``arguments`` JSON text becomes the object it spells (text that spells no JSON
    object stays text).
    """
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        for function in _calls(message) if object_arguments else ():
            parsed = _object_arguments(function.get("arguments"))
            if parsed is not None:
                function["arguments"] = parsed
    return out


_PROBE_VALUE = "mtp-studio-probe-value"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": "tool1", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                   "required": ["arg"]}}}]
_PROBE_MESSAGES = [
    {"role": "user", "content": "User message"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": {"arg": _PROBE_VALUE}}}]},
    {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
    {"role": "assistant", "content": "The tool response was 'tool response'"},
    {"role": "user", "content": "User message"},
]


def _takes_object_arguments(compiled: Any, limits: _Limits) -> bool:
    """Whether the template writes a call's arguments given as an object, or wants the JSON text.

    Most templates iterate the arguments (``|items``) or ``tojson`` them; a few concatenate the
    text (functionary v3.2), where an object fails or prints as a Python dict. As llama.cpp's
    capability check (common/jinja/caps.cpp), a small conversation tells: objects are right when
    it renders and the argument's value shows, but no Python ``repr`` of the object.
    """
    try:
        text = _collect(compiled.generate(messages=copy.deepcopy(_PROBE_MESSAGES), tools=copy.deepcopy(_PROBE_TOOLS),
                                          add_generation_prompt=False, bos_token="", eos_token=""), limits)
    except RenderCancelled:
        raise
    except Exception:  # any failure says "not objects"; the real rendering reports its own
        return False
    return _PROBE_VALUE in text and repr({"arg": _PROBE_VALUE}) not in text


def render(
    messages: list[dict[str, Any]],
    template: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    extra: dict[str, Any] | None = None,
    time_limit_s: float = TIME_LIMIT_S,
    max_chars: int = MAX_CHARS,
    should_stop: Callable[[], bool] = lambda: False,
) -> RenderedPrompt:
    """Render ``messages`` for generation.

    Args:
        messages: dicts with ``role`` and ``content``; an assistant's may carry OpenAI's
            ``tool_calls``, a ``tool`` message ``tool_call_id`` and ``name``.
        template: the GGUF's Jinja chat template; None or empty for plain completion.
        tools: OpenAI function tools, given to the template as ``tools``. None leaves ``tools``
            undefined, as templates that test ``tools is defined`` expect when there are none.
        add_generation_prompt: end with the text that opens the assistant's turn.
        continue_final_message: the last message is the assistant's unfinished reply (Continue):
            the conversation before it is rendered with the generation prompt, then its text, so
            the model goes on from its last word (plain completion simply ends with it).
        extra: more variables for the template (a request's ``chat_template_kwargs``, such as
            ``enable_thinking``); they cannot replace the ones above.

    Raises:
        TemplateError: the template does not compile, fails while rendering,
            or passes the time limit or ``max_chars``.
        RenderCancelled: ``should_stop`` said so while the template rendered.
    """
    if not template:
        text = "\n\n".join(m.get("content", "") for m in messages if m.get("content"))
        return RenderedPrompt(text=text, mode=COMPLETION, has_bos=False)
    final = ""
    if continue_final_message and messages and messages[-1].get("role") == "assistant":
        final, messages = messages[-1].get("content") or "", messages[:-1]
    limits = _Limits(time_limit_s, max_chars, should_stop)
    try:
        compiled = _environment(limits).from_string(template)
        json_arguments = any(_object_arguments(f.get("arguments")) is not None for m in messages for f in _calls(m))
        variables: dict[str, Any] = {
            "messages": _template_messages(messages, json_arguments and _takes_object_arguments(compiled, limits)),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": bos_token,
            "eos_token": eos_token,
        }
        if tools is not None:
            variables["tools"] = copy.deepcopy(tools)
        variables = {**copy.deepcopy(extra or {}), **variables}
        text = _collect(compiled.generate(**variables), limits) + final
    except (TemplateError, RenderCancelled):
        raise
    except Exception as exc:  # jinja2 raises many types; all mean the same to the user
        raise TemplateError(f"The model's chat template failed to render: {exc}") from exc
    try:  # a template can print a lone surrogate, which no tokenizer can take
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TemplateError(
            f"The model's chat template produced text that is not valid Unicode (at character {exc.start}). "
            "The model file's template is broken: use another export, or a plain completion prompt."
        ) from exc
    return RenderedPrompt(text=text, mode=TEMPLATE, has_bos=bool(bos_token) and text.startswith(bos_token))

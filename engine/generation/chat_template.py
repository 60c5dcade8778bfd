"""Render chat messages into a prompt with the GGUF's own chat template.

Templates come from model files, i.e. from strangers, so they run in Jinja's
sandbox, and within limits the sandbox alone does not set: a time limit
(a loop nested three deep would otherwise render for ever, with the worker
deaf to ``cancel``), a size limit on the text it builds (``'x' * 10**10``
would otherwise exhaust memory), and a stop callback checked as it runs, so
a cancelled request stops rendering too. The checks sit in the sandbox's
hooks: every call, attribute, item and operator, and every loop iteration
and frame (the compiled template calls :meth:`_Limits.tick` there).

A model without a template (like the embedded Gemma 3 270M base model) gets
plain completion: the conversation's text, in order, for the model to
continue. The result says which was used so the UI can be honest.
"""

from __future__ import annotations

import datetime
import functools
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
# a width or precision in a format string: "%0*d", "%10000d", "{:>10000}"
_FORMAT_WIDTHS = re.compile(r"%[-#0 +]*(\d+)?(?:\.(\d+))?|\{[^{}]*?:[^{}]*?(\d+)(?:\.(\d+))?[^{}]*\}")


class RenderCancelled(Exception):
    """Rendering stopped because the request was cancelled (not an error)."""


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    mode: str  # TEMPLATE or COMPLETION
    # True when the rendered text already starts with BOS, so tokenization must not add another.
    has_bos: bool


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
    from jinja2.compiler import CodeGenerator
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

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
            super().__init__(trim_blocks=True, lstrip_blocks=True)
            self.tick = limits.tick
            self.check_size = limits.check_size
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

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            limits.tick()
            limits.check_args(args, kwargs)
            owner = getattr(__obj, "__self__", None)
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
        return limits.check_size(func(*args, **kwargs))

    return bounded


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


def render(
    messages: list[dict[str, str]],
    template: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
    time_limit_s: float = TIME_LIMIT_S,
    max_chars: int = MAX_CHARS,
    should_stop: Callable[[], bool] = lambda: False,
) -> RenderedPrompt:
    """Render ``messages`` (dicts with role and content) for generation.

    Raises:
        TemplateError: the template does not compile, fails while rendering,
            or passes the time limit or ``max_chars``.
        RenderCancelled: ``should_stop`` said so while the template rendered.
    """
    if not template:
        text = "\n\n".join(m.get("content", "") for m in messages if m.get("content"))
        return RenderedPrompt(text=text, mode=COMPLETION, has_bos=False)
    limits = _Limits(time_limit_s, max_chars, should_stop)
    try:
        compiled = _environment(limits).from_string(template)
        text = _collect(compiled.generate(
            messages=messages,
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        ), limits)
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

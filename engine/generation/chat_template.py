"""Render chat messages into a prompt with the GGUF's own chat template.

Templates come from model files, i.e. from strangers, so they run in Jinja's
sandbox. A model without a template (like the embedded Gemma 3 270M base
model) gets plain completion: the conversation's text, in order, for the
model to continue. The result says which was used so the UI can be honest.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from engine.errors import TemplateError

COMPLETION = "completion"
TEMPLATE = "template"


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    mode: str  # TEMPLATE or COMPLETION
    # True when the rendered text already starts with BOS, so tokenization must not add another.
    has_bos: bool


def _raise(message: str) -> None:
    raise TemplateError(f"The model's chat template refused the conversation: {message}")


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def render(
    messages: list[dict[str, str]],
    template: str | None,
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> RenderedPrompt:
    """Render ``messages`` (dicts with role and content) for generation.

    Raises:
        TemplateError: the template does not compile or fails while rendering.
    """
    if not template:
        text = "\n\n".join(m.get("content", "") for m in messages if m.get("content"))
        return RenderedPrompt(text=text, mode=COMPLETION, has_bos=False)
    try:
        compiled = _environment().from_string(template)
        text = compiled.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateError:
        raise
    except Exception as exc:  # jinja2 raises many types; all mean the same to the user
        raise TemplateError(f"The model's chat template failed to render: {exc}") from exc
    return RenderedPrompt(text=text, mode=TEMPLATE, has_bos=bool(bos_token) and text.startswith(bos_token))

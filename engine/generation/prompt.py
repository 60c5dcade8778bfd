"""A request's prompt as tokens: its messages through the chat template (or
its text as it is), refused early when it cannot fit the context.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import ContextError
from engine.generation import chat_template
from engine.generation.request import GenerateRequest
from engine.generation.session import Session

# A prompt longer than this many characters per context token cannot fit (real
# tokenizers average 2-5 characters a token); refusing it before tokenizing
# spares a 100 MB prompt a minute of uncancellable tokenization.
MAX_CHARS_PER_TOKEN = 16


def max_prompt_chars(n_ctx: int) -> int:
    """The longest prompt text (characters) worth tokenizing for a context of ``n_ctx`` tokens."""
    return MAX_CHARS_PER_TOKEN * n_ctx


def check_prompt_chars(n_chars: int, n_ctx: int) -> None:
    """Refuse text that cannot fit the context however it tokenizes, before tokenizing it."""
    if n_chars > max_prompt_chars(n_ctx):
        raise ContextError(
            f"The prompt has {n_chars:,} characters; a context of {n_ctx} tokens holds at most "
            f"{max_prompt_chars(n_ctx):,} ({MAX_CHARS_PER_TOKEN} per token). "
            "Shorten the conversation or raise the context size."
        )


def render_prompt(session: Session, request: GenerateRequest,
                  should_stop: Callable[[], bool] = lambda: False) -> tuple[list[int], str]:
    """Tokens of the request's prompt, and the mode (template or completion).

    Raises:
        ContextError: the text is far too long for the context.
        TemplateError: the chat template failed or passed its limits.
        chat_template.RenderCancelled: ``should_stop`` said so while rendering.
    """
    tokens, mode, _ = render_request(session, request, should_stop)
    return tokens, mode


def render_request(session: Session, request: GenerateRequest,
            should_stop: Callable[[], bool]) -> tuple[list[int], str, bool]:
    """As :func:`render_prompt`, and whether the prompt ends inside a thinking block it opened."""
    model = session.model
    n_ctx = session.target.n_ctx
    if request.messages is not None:
        check_prompt_chars(sum(len(m.get("content") or "") for m in request.messages), n_ctx)
        bos = model.token_text(model.bos) if model.add_bos else ""
        rendered = chat_template.render(
            list(request.messages), request.template or session.facts.chat_template,
            bos_token=bos, eos_token=model.token_text(model.eos),
            max_chars=max(max_prompt_chars(n_ctx), chat_template.MAX_CHARS), should_stop=should_stop,
            tools=list(request.tools) if request.tools else None, extra=request.template_kwargs,
            continue_final_message=request.continue_final_message,
        )
        check_prompt_chars(len(rendered.text), n_ctx)
        tokens = model.tokenize(rendered.text, add_special=not rendered.has_bos, parse_special=True)
        return tokens, rendered.mode, rendered.opens_thinking
    check_prompt_chars(len(request.prompt or ""), n_ctx)
    prompt = model.tokenize(request.prompt or "", add_special=True, parse_special=True)
    return prompt, chat_template.COMPLETION, False

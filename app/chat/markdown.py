"""Markdown to HTML for replies: markdown-it-py parses, Pygments colours code.

Both are kept libraries: markdown-it-py follows CommonMark (nested lists,
links, emphasis, block quotes) plus GitHub's tables and strikethrough, and
Pygments knows hundreds of languages. What stays here is only how a reply
looks in a ``QTextBrowser``: code blocks as a shaded table with a language
label and a "Copy" link, tables with borders, headings two levels smaller.

Safety: raw HTML in the model's output is never passed through (markdown-it's
``html`` option is off, so ``<b>`` is shown as text) and links are checked by
markdown-it (no ``javascript:``). Speed: the streaming transcript renders each
finished paragraph once and the whole reply once at the end; a parser and a
formatter per style are built once, and whole renders are cached (a
transcript redraw re-renders every message with the same text).
"""

from __future__ import annotations

import html
import re
from functools import lru_cache
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

FENCE = re.compile(r"^```", re.MULTILINE)  # the transcript's streaming uses it to tell "inside a code block"
CODE_TOKENS = ("fence", "code_block")
HEADING_SHIFT = 2  # "# Title" in a reply is a section, not the page's title: h1 -> h3


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    # "breaks": a single newline is a line break, as people (and models) write in a chat
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])


@lru_cache(maxsize=8)
def _formatter(style: str) -> HtmlFormatter:
    # inline styles: a QTextDocument has no stylesheet classes to look up
    return HtmlFormatter(style=style, noclasses=True, nowrap=True)


@lru_cache(maxsize=64)
def _lexer(language: str) -> Any:
    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False) if language else TextLexer()
    except ClassNotFound:
        return TextLexer()


# Pygments compiles a language's rules on first use (python: ~45 ms, javascript ~25 ms on a
# laptop core): done while the app is idle, so the first code block of a reply does not stall it.
COMMON_LANGUAGES = ("python", "javascript", "typescript", "bash", "c", "cpp", "rust", "go", "java", "json")


def warm_up(language: str, palette: dict[str, str]) -> None:
    """Prepare ``language``'s lexer and the palette's formatter ahead of the first code block."""
    highlight_code("", palette, language)


def highlight_code(code: str, palette: dict[str, str], language: str = "") -> str:
    """``code`` escaped and coloured by Pygments for ``language`` (plain when unknown)."""
    out = highlight(code, _lexer(language.lower()), _formatter(palette.get("pygments_style", "default")))
    return out[:-1] if out.endswith("\n") and not code.endswith("\n") else out


def _code_html(code: str, language: str, palette: dict[str, str], copy_href: str) -> str:
    label = html.escape(language) or "code"
    copy = f' &nbsp; <a href="{copy_href}">Copy</a>' if copy_href else ""
    return (
        f'<table width="100%" cellpadding="8" style="background:{palette["code_bg"]};'
        f'margin-top:4px;margin-bottom:4px"><tr><td>'
        f'<span style="color:{palette["muted"]};font-size:small">{label}{copy}</span>'
        f'<pre style="font-family:monospace;margin:0">{highlight_code(code.rstrip(), palette, language)}</pre>'
        "</td></tr></table>"
    )


def _language(token: Token) -> str:
    return token.info.strip().split(maxsplit=1)[0] if token.info.strip() else ""


def render(markdown: str, palette: dict[str, str], copy_prefix: str = "", first_block: int = 0) -> str:
    """HTML for ``markdown``. An unclosed code fence (mid-stream) renders as code so far.

    With ``copy_prefix``, each code block gets a "Copy" link ``<copy_prefix><n>``,
    numbered from ``first_block`` (a part of a longer text numbers on from there).
    """
    return _render(markdown, tuple(sorted(palette.items())), copy_prefix, first_block)


@lru_cache(maxsize=512)
def _render(markdown: str, palette_items: tuple[tuple[str, str], ...], copy_prefix: str, first_block: int) -> str:
    palette = dict(palette_items)
    md = _parser()
    tokens = md.parse(markdown)
    parts: list[str] = []
    block = first_block
    rest: list[Token] = []  # tokens markdown-it renders itself, flushed before each code block

    def flush() -> None:
        if rest:
            # markdown-it ends each tag with a newline, which a QTextDocument shows as a space
            parts.append(md.renderer.render(rest, md.options, {}).replace(">\n", ">"))
            rest.clear()

    for tok in tokens:
        if tok.type in CODE_TOKENS:
            flush()
            href = f"{copy_prefix}{block}" if copy_prefix else ""
            parts.append(_code_html(tok.content, _language(tok) if tok.type == "fence" else "", palette, href))
            block += 1
            continue
        if tok.type in ("heading_open", "heading_close"):
            tok.tag = f"h{min(int(tok.tag[1]) + HEADING_SHIFT, 6)}"
        elif tok.type == "table_open":
            tok.attrSet("border", "1")
            tok.attrSet("cellspacing", "0")
            tok.attrSet("cellpadding", "4")
            tok.attrSet("style", f"border-collapse:collapse;border-color:{palette['muted']};margin:4px 0")
        rest.append(tok)
    flush()
    return "".join(parts)


def code_blocks(markdown: str) -> list[str]:
    """The contents of the code blocks, for the copy links (numbered as :func:`render` numbers them)."""
    return [tok.content.rstrip() for tok in _parser().parse(markdown) if tok.type in CODE_TOKENS]


def settle_point(text: str, after: int) -> int:
    """The end of the last complete paragraph of ``text`` past ``after``: a blank
    line that is not inside a code fence. Returns ``after`` when there is none."""
    end = len(text)
    while True:
        i = text.rfind("\n\n", after, end)
        if i <= after:
            return after
        if len(FENCE.findall(text, 0, i)) % 2 == 0:
            return i + 2
        end = i

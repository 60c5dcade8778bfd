"""A small Markdown-to-HTML renderer for streamed replies.

Only what chat replies use: fenced code blocks (with a language label and
light syntax highlighting), inline code, bold, italics, headings and lists.
It must be cheap (it re-renders the streaming message many times a second)
and safe (everything is escaped; the model's output is never HTML).
"""

from __future__ import annotations

import html
import re

_KEYWORDS = frozenset(
    "def class return if elif else for while in import from as with try except finally raise "
    "lambda yield pass break continue and or not is None True False async await fn let mut pub "
    "struct impl enum match use const static void int char float double auto namespace template "
    "typename include public private protected new delete this function var".split()
)
FENCE = re.compile(r"^```", re.MULTILINE)
_BULLET = re.compile(r"^\s*([-*]|\d+\.)\s+")
_TOKEN = re.compile(r'(#[^\n]*|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|\b\w+\b)')


def highlight_code(code: str, palette: dict[str, str]) -> str:
    """Escape ``code`` and colour comments, strings, keywords and numbers."""
    out: list[str] = []
    last = 0
    for m in _TOKEN.finditer(code):
        out.append(html.escape(code[last:m.start()]))
        tok = m.group(0)
        color = None
        if tok.startswith(("#", "//")):
            color = palette["comment"]
        elif tok[0] in "\"'":
            color = palette["string"]
        elif tok in _KEYWORDS:
            color = palette["keyword"]
        elif tok[0].isdigit():
            color = palette["number"]
        esc = html.escape(tok)
        out.append(f'<span style="color:{color}">{esc}</span>' if color else esc)
        last = m.end()
    out.append(html.escape(code[last:]))
    return "".join(out)


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"`([^`\n]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*([^*\n]+)\*\*", r"<b>\1</b>", text)
    text = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"<i>\1</i>", text)
    return text


def render(markdown: str, palette: dict[str, str], copy_prefix: str = "", first_block: int = 0) -> str:
    """HTML for ``markdown``. An unclosed code fence (mid-stream) renders as code so far.

    With ``copy_prefix``, each code block gets a "Copy" link ``<copy_prefix><n>``,
    numbered from ``first_block`` (a part of a longer text numbers on from there).
    """
    parts: list[str] = []
    chunks = re.split(r"^```", markdown, flags=re.MULTILINE)
    for i, chunk in enumerate(chunks):
        if i % 2 == 1:  # inside a fence: first line is the language
            lang, _, code = chunk.partition("\n")
            label = html.escape(lang.strip()) or "code"
            copy = f' &nbsp; <a href="{copy_prefix}{first_block + i // 2}">Copy</a>' if copy_prefix else ""
            parts.append(
                f'<table width="100%" cellpadding="8" style="background:{palette["code_bg"]};'
                f'margin-top:4px;margin-bottom:4px"><tr><td>'
                f'<span style="color:{palette["muted"]};font-size:small">{label}{copy}</span>'
                f'<pre style="font-family:monospace;margin:0">{highlight_code(code.rstrip(), palette)}</pre>'
                "</td></tr></table>"
            )
            continue
        for para in re.split(r"\n{2,}", chunk.strip("\n")):
            if not para.strip():
                continue
            lines = para.split("\n")
            if all(re.match(r"\s*([-*]|\d+\.)\s", ln) for ln in lines):
                tag = "ol" if re.match(r"\s*\d+\.", lines[0]) else "ul"
                items = "".join(f"<li>{_inline(_BULLET.sub('', ln))}</li>" for ln in lines)
                parts.append(f"<{tag}>{items}</{tag}>")
            elif m := re.match(r"(#{1,4})\s+(.*)", para):
                level = min(len(m.group(1)) + 2, 6)
                parts.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
            else:
                parts.append("<p>" + "<br>".join(_inline(ln) for ln in lines) + "</p>")
    return "".join(parts)


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced code blocks, for the copy buttons."""
    chunks = re.split(r"^```", markdown, flags=re.MULTILINE)
    return [chunk.partition("\n")[2].rstrip() for i, chunk in enumerate(chunks) if i % 2 == 1]

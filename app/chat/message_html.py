"""Pieces of the transcript's HTML — a message's header, the links under it, the system prompt line —
and what a click on a link asks for.

``version:I:±1`` (the ``‹ 2/3 ›`` arrows), ``edit:I``, ``continue:``, ``system-prompt:``,
``message-copy|delete|fork:I``, a code block's ``copy:I:B`` and a thumbnail's ``image:I:N``; the
transcript emits the matching signal and the chat controller answers (app/chat/message_actions.py for the
message actions; a thumbnail opens app/chat/image_viewer.py).
"""

from __future__ import annotations

import html

from app.theme import Palette

SYSTEM_PROMPT_CHARS = 300  # of the system prompt shown above the messages
MESSAGE_ACTIONS = ("copy", "delete", "fork")  # each stored message's links


def footer_links(index: int, role: str, message_id: int | None, status: str, version: int, version_count: int,
                 continues: bool) -> list[str]:
    """The links of message ``index`` (HTML); ``continues``: it is the last reply and ended before its end."""
    links = []
    if version_count > 1 and status != "streaming":
        # the arrows at the text's size, bold, with room either side: in the footer's small print they were
        # a few pixels wide and hard to hit
        arrow = 'style="font-size:medium;font-weight:bold;text-decoration:none"'
        links.append(f'<a href="version:{index}:-1" {arrow}>&nbsp;&nbsp;‹&nbsp;&nbsp;</a>'
                     f'{version + 1}/{version_count}'
                     f'<a href="version:{index}:1" {arrow}>&nbsp;&nbsp;›&nbsp;&nbsp;</a>')
    if role == "user" and message_id is not None:
        links.append(f'<a href="edit:{index}">Edit</a>')
    if continues and status != "streaming":
        links.append('<a href="continue:">Continue</a>')
    if message_id is not None and status != "streaming":
        links += [f'<a href="message-{action}:{index}">{action.capitalize()}</a>' for action in MESSAGE_ACTIONS]
    return links


def unbroken(text: str) -> str:
    """``120 tokens · 16.2 tok/s · 4.0 s`` as HTML that wraps only at its dots: a narrow transcript broke the
    footer inside a figure ("4.0" on one line, "s" on the next; "tok/" and "s")."""
    return " · ".join(html.escape(part).replace(" ", "&nbsp;").replace("/", "/&#8288;")  # U+2060 joins "tok/"
                      for part in text.split(" · "))  # to "s": Qt breaks after a slash too


def parse_link(text: str) -> tuple[str, tuple]:
    """What a clicked link asks for: ``(kind, arguments)``; ``("", ())`` for anything else."""
    if text.startswith("version:"):
        _, msg_index, step = text.split(":")
        return "version", (int(msg_index), int(step))
    if text.startswith("edit:"):
        return "edit", (int(text.split(":")[1]),)
    if text.startswith("continue:"):
        return "continue", ()
    if text == "system-prompt:":
        return "system-prompt", ()
    if text.startswith("message-"):  # message-delete:3 (a code block's Copy is copy:3:0)
        action, msg_index = text.removeprefix("message-").split(":")
        return "message", (action, int(msg_index))
    if text.startswith(("copy:", "image:")):  # a code block's Copy, or image N of the message
        kind, msg_index, block_index = text.split(":")
        return kind, (int(msg_index), int(block_index))
    return "", ()


def header_html(role: str, status: str, working: str, p: Palette) -> str:
    """Who speaks, and while a reply streams what it is doing (``working``: the prefill's progress)."""
    who = {"user": "You", "assistant": "Assistant", "system": "System"}.get(role, role)
    color = p.accent if role == "assistant" else p.user
    doing = html.escape(working) if working else "…"
    return (f'<p style="margin-top:14px;margin-bottom:2px"><b style="color:{color}">{who}</b>'
            + (f' <span style="color:{p.muted}">{doing}</span>' if status == "streaming" else "") + "</p>")


def system_prompt_html(system_prompt: str, p: Palette) -> str:
    """The system prompt, muted, cut at SYSTEM_PROMPT_CHARS (the whole in the chat's settings)."""
    text = " ".join(system_prompt.split())
    if len(text) > SYSTEM_PROMPT_CHARS:
        text = text[:SYSTEM_PROMPT_CHARS] + "…"
    return (f'<p style="color:{p.muted};margin-bottom:12px"><b>System prompt</b>: {html.escape(text)}'
            f' &nbsp;·&nbsp; <a href="system-prompt:">Edit</a></p>')

"""A conversation written out: Markdown and plain text (the shown path), JSON (every version and branch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.chat import rows

if TYPE_CHECKING:
    from app.chat.store import ConversationStore

NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}


def markdown(store: ConversationStore, conversation_id: int) -> str:
    conv = store.get(conversation_id)
    lines = [f"# {conv.title}", ""]
    if conv.system_prompt:
        lines += [f"> System: {conv.system_prompt}", ""]
    for m in store.messages(conversation_id):
        note = "" if m.status == "complete" else f" _({m.status})_"
        lines += [f"**{m.role.capitalize()}**{note}", "", m.content, ""]
    return "\n".join(lines)


def as_json(store: ConversationStore, conversation_id: int) -> dict[str, Any]:
    conv = store.get(conversation_id)
    return {
        "title": conv.title, "system_prompt": conv.system_prompt, "settings": conv.settings,
        "created": conv.created,
        "model": conv.model,
        "messages": [_exported(store, m) for m in store.messages(conversation_id)],
    }


def _exported(store: ConversationStore, m: rows.Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content, "status": m.status, "stats": m.stats,
                           "created": m.created}
    if m.version_count > 1:  # every version (an edit's with its branch), the shown one marked
        row = store.db.execute("SELECT * FROM messages WHERE id=?", (m.id,)).fetchone()
        out["versions"], out["version"] = rows.versions(row), m.version
    return out


def text(store: ConversationStore, conversation_id: int) -> str:
    """Plain text: who said what, for pasting anywhere."""
    conv = store.get(conversation_id)
    lines = [conv.title, "=" * len(conv.title), ""]
    if conv.system_prompt:
        lines += [f"System: {conv.system_prompt}", ""]
    for m in store.messages(conversation_id):
        note = "" if m.status == "complete" else f" ({m.status})"
        lines += [f"{NAMES.get(m.role, m.role)}{note}:", m.content, ""]
    return "\n".join(lines)

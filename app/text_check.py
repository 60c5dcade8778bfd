"""Is what the user typed text? A Python ``str`` may hold a lone UTF-16
surrogate (a broken paste, a ``\\ud800`` escape) that UTF-8 cannot encode:
SQLite, the settings file, the worker's pipe and a log line all refuse it,
some with an exception inside Qt. Each field whose text reaches them asks
here first, and the user is told which field to fix; nothing they typed is
changed or dropped.
"""

from __future__ import annotations


def is_text(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def not_text_notice(field: str) -> str:
    """What the user is told about a field (named as its label reads) that holds such a character."""
    return (f"“{field}” holds a character that is not valid text (a lone surrogate, as a broken paste can "
            "leave): remove it and try again.")


def first_not_text(fields: dict[str, str]) -> str | None:
    """The label of the first field (label -> its text) that is not valid text; None when all are."""
    return next((label for label, text in fields.items() if not is_text(text)), None)

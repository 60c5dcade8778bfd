"""The Hugging Face token: kept in the OS keyring, never written to logs or
settings files. ``HF_TOKEN`` in the environment wins; without a keyring
backend the token is simply not remembered between runs."""

from __future__ import annotations

import os

SERVICE = "mtp-studio"
USER = "huggingface"


_keyring_broken = False


def get_token() -> str | None:
    """The token, or None. May block briefly on the system keyring: call it off the GUI thread."""
    global _keyring_broken
    env = os.environ.get("HF_TOKEN")
    if env or _keyring_broken:
        return env or None
    try:
        import keyring

        return keyring.get_password(SERVICE, USER)
    except Exception:  # no keyring package or no backend (headless Linux): do not ask again
        _keyring_broken = True
        return None


def set_token(token: str) -> bool:
    """Store the token; False when no keyring backend is available."""
    try:
        import keyring

        keyring.set_password(SERVICE, USER, token)
        return True
    except Exception:
        return False

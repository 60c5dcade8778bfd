"""The local server's API key: made with ``secrets``, kept in the OS keyring
beside the Hugging Face token (``engine/store/credentials.py``), never written
to logs or settings files. ``MTP_STUDIO_API_KEY`` in the environment wins."""

from __future__ import annotations

import hmac
import os
import secrets

from engine.store.credentials import SERVICE

USER = "local-server-api-key"
PREFIX = "mtp-"


def generate() -> str:
    """A new key: 32 random bytes, URL-safe, recognisable by its prefix."""
    return PREFIX + secrets.token_urlsafe(32)


def get_key() -> str | None:
    """The stored key, or None. May block briefly on the system keyring."""
    env = os.environ.get("MTP_STUDIO_API_KEY")
    if env:
        return env
    try:
        import keyring

        return keyring.get_password(SERVICE, USER)
    except Exception:  # no keyring backend (headless Linux): nothing remembered
        return None


def set_key(key: str) -> bool:
    """Store the key; False when no keyring backend is available (it then lasts this run only)."""
    try:
        import keyring

        keyring.set_password(SERVICE, USER, key)
        return True
    except Exception:
        return False


def matches(given: str, expected: str) -> bool:
    """Constant-time comparison, so the time taken says nothing about the key."""
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))

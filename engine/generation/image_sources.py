"""Where a request's images come from, without llama.cpp: the image parts of chat messages
(OpenAI's ``image_url`` and the Responses API's ``input_image``) and the encoded file a part names.
The server's other APIs (Anthropic's ``image`` blocks, Ollama's ``images``) name their images as
data URLs made by :func:`data_url`, so every image is read by :func:`read_image` alone.

Data URLs are always taken; local files only where the caller allows them (the
CLI, a server started with ``--allow-local-images``); remote URLs never: the
engine has no business on the network. The server imports this module, so it
stays free of the runtime.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

from engine.errors import ImageError

# OpenAI's content part types that carry an image (chat completions; the Responses API)
IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})
MAX_IMAGE_BYTES = 32 * 2**20  # one encoded image; a larger one is refused before it is decoded


def image_source(part: dict[str, Any]) -> str:
    """The URL (or path) an image content part names: ``image_url.url`` (chat completions), ``image_url``
    as a string (the Responses API), or ``url`` / ``path``."""
    ref = part.get("image_url", part.get("url", part.get("path")))
    if isinstance(ref, dict):
        ref = ref.get("url")
    if not isinstance(ref, str) or not ref:
        raise ImageError(f"an image part of type {part.get('type')!r} names no image (expected image_url.url)")
    return ref


def data_url(payload: str, media_type: str = "image/png") -> str:
    """A ``data:`` URL for base64 ``payload`` (Anthropic's base64 source, Ollama's ``images``), which
    :func:`read_image` then checks and decodes as any other."""
    return f"data:{media_type};base64,{payload}"


def read_image(source: str, *, allow_files: bool = False, max_bytes: int = MAX_IMAGE_BYTES) -> bytes:
    """The encoded image a source names: a ``data:`` URL (base64), or, with ``allow_files``, a local path or
    ``file://`` URL. Remote URLs are never fetched here: the engine has no business on the network.

    Raises:
        ImageError: what is wrong with the source, in words the sender can act on.
    """
    if source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ImageError("an image data URL must be base64: data:image/png;base64,…")
        if len(payload) * 3 // 4 > max_bytes:
            raise ImageError(f"an image of about {len(payload) * 3 // 4:,} bytes; at most {max_bytes:,} are taken")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ImageError("an image data URL whose base64 does not decode") from None
    if source.startswith(("http://", "https://")):
        raise ImageError(f"remote images are not fetched ({source[:80]}); send the image itself as a "
                         "data:image/…;base64 URL")
    if not allow_files:
        raise ImageError("images are taken as data:image/…;base64 URLs here; local files are not read")
    path = Path(source.removeprefix("file://")).expanduser()
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ImageError(f"{path.name} has {size:,} bytes; at most {max_bytes:,} are taken")
        return path.read_bytes()
    except OSError as exc:
        raise ImageError(f"the image {path} cannot be read: {exc.strerror or exc}") from None

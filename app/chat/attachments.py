"""An image attached to a chat message, as the store keeps it and the worker receives it.

Images live in the conversation database itself (the ``images`` table, one row
per distinct image, keyed by the SHA-256 of its bytes), not as files beside it:
an image is then written in the same transaction as the message that carries
it (a full disk leaves neither), a deleted conversation cannot leave a file
behind or lose one, the database stays the one file the store rescues or sets
aside, and the same image pasted twice is kept once. Messages name their
images by hash (``messages.images``, JSON), so a branch or version that moves
rows around (``app/chat/versions.py``) carries the names and never the bytes.

No Qt here: reading files and the clipboard, and thumbnails, are
``app/chat/image_input.py``'s.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

# the worker refuses a larger encoded image (engine/generation/image_sources.py MAX_IMAGE_BYTES)
MAX_IMAGE_BYTES = 32 * 2**20
# what mtmd decodes (stb_image): anything else is re-encoded as PNG before it is attached
SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"),
              (b"GIF87a", "image/gif"), (b"GIF89a", "image/gif"), (b"BM", "image/bmp"))


def mime_of(data: bytes) -> str | None:
    """The image type mtmd can decode that ``data`` starts like, or None."""
    return next((mime for magic, mime in SIGNATURES if data.startswith(magic)), None)


@dataclass(frozen=True)
class Attachment:
    """One encoded image (PNG, JPEG, GIF or BMP bytes) attached to a message."""

    data: bytes
    mime: str

    @classmethod
    def of(cls, data: bytes) -> Attachment:
        """``data`` as an attachment.

        Raises:
            ValueError: it is not an image mtmd decodes, or is larger than the worker takes.
        """
        mime = mime_of(data)
        if mime is None:
            raise ValueError("not a PNG, JPEG, GIF or BMP image")
        if len(data) > MAX_IMAGE_BYTES:
            raise ValueError(f"{len(data) / 2**20:.0f} MiB; images of at most {MAX_IMAGE_BYTES // 2**20} MiB "
                             "are sent")
        return cls(data, mime)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def base64(self) -> str:
        """As the worker protocol carries it (``GenerateRequestMsg.images``)."""
        return base64.b64encode(self.data).decode("ascii")

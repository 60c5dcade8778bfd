"""A turn's images as the worker takes them: one ``<__media__>`` marker per image in its message's text
(before the words, as ``mtp-studio chat --image`` puts them), and the images in marker order beside
the messages (``GenerateRequestMsg.images``, base64).

The engine renders the messages through the chat template and mtmd puts each
image's rows where its marker is (``engine/generation/images.py``). Only the
messages the turn keeps send their images: an image left out to fit the
context goes with its message. A model without a vision projector gets the
text alone, and the chat says how many images it did not see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.chat.attachments import Attachment
from app.chat.context_fit import Turn
from engine.worker.protocol import IMAGE_MARKER

TYPED_MARKER = IMAGE_MARKER.replace("__", "_")  # the marker's text in a message, shown but no image's place


@dataclass(frozen=True)
class ImageTurn:
    messages: list[dict[str, str]]
    images: list[str]  # base64, one per marker, in order
    left_out: int  # images the model could not take (no projector) or the store no longer holds


def with_images(turn: Turn, image: Callable[[str], Attachment | None], vision: bool) -> ImageTurn:
    """The turn's request messages with their images' markers, and the images (``image``: the store's
    lookup by hash; ``vision``: the loaded model takes images)."""
    messages = turn.request_messages()
    kept = turn.messages[turn.dropped:]
    first = len(messages) - len(kept)  # after the system prompt
    found = [[a for a in (image(h) for h in m.images) if a is not None] for m in kept]
    left_out = sum(len(m.images) - len(f) for m, f in zip(kept, found, strict=True))
    if not vision:
        return ImageTurn(messages, [], left_out + sum(len(f) for f in found))
    images: list[str] = []
    if any(found):  # a marker typed by hand would take an image's place: only the app's own are markers
        for message in messages:
            message["content"] = message["content"].replace(IMAGE_MARKER, TYPED_MARKER)
    for i, attached in enumerate(found):
        if attached:
            messages[first + i]["content"] = f"{IMAGE_MARKER}\n" * len(attached) + messages[first + i]["content"]
            images += [a.base64() for a in attached]
    return ImageTurn(messages, images, left_out)

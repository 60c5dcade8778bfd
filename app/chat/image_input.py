"""Images coming into the chat: from a file (the Attach button, a drop), from the clipboard (a paste), and
their thumbnails.

What the worker receives must be a format mtmd decodes (PNG, JPEG, GIF, BMP):
anything else Qt reads (WebP, TIFF, …) is re-encoded as PNG. A photo larger
than :data:`MAX_SIDE` on its long side is scaled down first: the projector
resizes every image to its own patch grid anyway, so the extra pixels would
only fill the database and the pipe.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QMimeData, Qt
from PySide6.QtGui import QImage, QImageReader

from app.chat.attachments import MAX_IMAGE_BYTES, Attachment, mime_of

MAX_SIDE = 2048  # pixels on the long side that are kept; a larger image is scaled down
THUMBNAIL_PX = 96  # the long side of a thumbnail, in the composer and the transcript


class ImageRefused(ValueError):
    """The file or clipboard content is not an image that can be attached; the text says why."""


def from_file(path: str | Path) -> Attachment:
    """The image in ``path``, ready to attach.

    Raises:
        ImageRefused: it cannot be read, is no image, or is too large.
    """
    name = Path(path).name
    try:
        size = Path(path).stat().st_size
        if size > 4 * MAX_IMAGE_BYTES:  # never read a huge file whole only to refuse it
            raise ImageRefused(f"{name} is {size / 2**20:.0f} MiB, too large to attach")
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ImageRefused(f"{name} could not be read ({exc.strerror or exc})") from exc
    return from_bytes(data, name)


def from_bytes(data: bytes, name: str = "the image") -> Attachment:
    """Encoded image bytes, kept as they are when mtmd decodes them and they are small enough, else
    re-encoded (scaled to :data:`MAX_SIDE`, PNG unless the source was a JPEG)."""
    image = QImage.fromData(data)
    if image.isNull():
        raise ImageRefused(f"{name} is not an image this app can read")
    if mime_of(data) is not None and max(image.width(), image.height()) <= MAX_SIDE and len(data) <= MAX_IMAGE_BYTES:
        return Attachment(data, mime_of(data) or "")
    return from_qimage(image, jpeg=mime_of(data) == "image/jpeg", name=name)


def from_qimage(image: QImage, *, jpeg: bool = False, name: str = "the image") -> Attachment:
    """A picture (a paste) encoded for the worker: PNG, or JPEG for a photo that was one."""
    if image.isNull():
        raise ImageRefused(f"{name} is empty")
    if max(image.width(), image.height()) > MAX_SIDE:
        image = image.scaled(MAX_SIDE, MAX_SIDE, Qt.AspectRatioMode.KeepAspectRatio,
                             Qt.TransformationMode.SmoothTransformation)
    raw = QByteArray()
    buffer = QBuffer(raw)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "JPG" if jpeg else "PNG", 90 if jpeg else -1)
    buffer.close()
    try:
        return Attachment.of(bytes(raw.data()))
    except ValueError as exc:
        raise ImageRefused(f"{name}: {exc}") from exc


def image_files(mime: QMimeData) -> list[str]:
    """The local files a drop or paste carries whose names say they are images."""
    readable = {bytes(f.data()).decode("ascii", "replace").lower() for f in QImageReader.supportedImageFormats()}
    files = [url.toLocalFile() for url in mime.urls() if url.isLocalFile()] if mime.hasUrls() else []
    return [f for f in files if Path(f).suffix.lower().lstrip(".") in readable]


def carries_image(mime: QMimeData) -> bool:
    """Whether a drop or paste brings an image (clipboard pixels, or an image file)."""
    return mime.hasImage() or bool(image_files(mime))


def from_mime(mime: QMimeData) -> tuple[list[Attachment], list[str]]:
    """The images a drop or paste carries, and what was refused (one reason each)."""
    found: list[Attachment] = []
    refused: list[str] = []
    files = image_files(mime)
    for path in files:
        try:
            found.append(from_file(path))
        except ImageRefused as exc:
            refused.append(str(exc))
    if not files and mime.hasImage():
        try:
            found.append(from_qimage(QImage(mime.imageData()), name="the pasted image"))
        except (ImageRefused, TypeError) as exc:
            refused.append(str(exc))
    return found, refused


def thumbnail(attachment: Attachment, px: int = THUMBNAIL_PX) -> QImage:
    """The image scaled to fit ``px`` on its long side (never enlarged); a grey square if it does not decode."""
    image = QImage.fromData(attachment.data)
    if image.isNull():
        image = QImage(px, px, QImage.Format.Format_RGB32)
        image.fill(Qt.GlobalColor.lightGray)
        return image
    if max(image.width(), image.height()) <= px:
        return image
    return image.scaled(px, px, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)

"""An attached image at full size: a click on a thumbnail (the transcript's, or the attach strip's above the
input box) opens it here, since a 96 px thumbnail cannot show what the model was asked about.

The viewer is a dialog of its own (Esc or Close shuts it, both by keyboard): the image at its own pixel size,
or scaled down, keeping its aspect ratio, to fit the screen it opens on; under it a caption with what the
conversation keeps of it — its place among the message's images, its pixel size, its type and bytes
(the database stores images by content, not by the name of the file they came from:
``app/chat/attachments.py``). It reads only the bytes the message carries, so an image opens the same after
a restart as when it was attached.

The transcript's thumbnails are links (``image:M:I``, image I of message M: :func:`thumbnails_html`), so
Tab reaches them and Enter opens them like any other link in the transcript.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication, QImage, QPixmap
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from app.chat import image_input
from app.chat.attachments import Attachment

SCREEN_SHARE = 0.9  # of the screen's free area the dialog may take; the rest leaves the window behind visible
CAPTION_ROOM = 90  # pixels under the image for the caption and the Close button


def describe(image: QImage, attachment: Attachment, place: str) -> str:
    """``Image 1 of 2 · 640 × 480 px · PNG, 12 KiB`` (``place``: ``Image 1 of 2``)."""
    kind = attachment.mime.removeprefix("image/").upper()
    return f"{place} · {image.width()} × {image.height()} px · {kind}, {len(attachment.data) / 1024:,.0f} KiB"


def fit_size(size: QSize, room: QSize) -> QSize:
    """``size`` scaled down to fit ``room`` keeping its aspect ratio; never enlarged."""
    if size.width() <= room.width() and size.height() <= room.height():
        return QSize(size)
    return size.scaled(room, Qt.AspectRatioMode.KeepAspectRatio)


class ImageViewer(QDialog):
    """One image at full size (or fitted to the screen), its caption and a Close button.

    Attributes:
        image_size: the image's own pixel size (what the caption says).
        picture: the label showing it; its pixmap is the image as drawn (``image_size`` unless it was scaled).
    """

    def __init__(self, attachment: Attachment, place: str = "Image", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        image = QImage.fromData(attachment.data)
        if image.isNull():  # never stored (attachments are decoded first), but a damaged row must still open
            image = image_input.thumbnail(attachment)
        self.image_size = image.size()
        self.setWindowTitle(describe(image, attachment, place))
        screen = (parent.screen() if parent is not None else None) or QGuiApplication.primaryScreen()
        free = screen.availableGeometry().size() * SCREEN_SHARE
        room = QSize(max(64, free.width() - 24), max(64, free.height() - CAPTION_ROOM))
        shown = fit_size(image.size(), room)
        if shown != image.size():
            image = image.scaled(shown, Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)
        self.picture = QLabel()
        self.picture.setPixmap(QPixmap.fromImage(image))
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.picture.setAccessibleName(self.windowTitle())
        scaled = f" · shown at {100 * shown.width() / max(1, self.image_size.width()):.0f} %" \
            if shown != self.image_size else ""
        self.caption = QLabel(self.windowTitle() + scaled)
        self.caption.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.caption.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        col = QVBoxLayout(self)
        col.addWidget(self.picture, 1)
        col.addWidget(self.caption)
        col.addWidget(buttons)
        buttons.button(QDialogButtonBox.StandardButton.Close).setFocus()


def show_image(parent: QWidget, images: Sequence[Attachment], index: int) -> ImageViewer | None:
    """Open image ``index`` of ``images`` in a viewer (window-modal, returns at once); None when there is none.
    The viewer deletes itself when closed."""
    if not 0 <= index < len(images):
        return None
    viewer = ImageViewer(images[index], f"Image {index + 1} of {len(images)}", parent)
    viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    viewer.open()
    return viewer


def thumbnails_html(message_index: int, images: Sequence[Attachment], drawn: dict[str, QImage]) -> str:
    """A message's images as thumbnails, each a link (``image:M:I``) that opens it full size; ``drawn`` caches
    each thumbnail by its resource name (``thumb:<hash>``), which the transcript's loadResource answers from."""
    if not images:
        return ""
    cells = []
    for i, image in enumerate(images):
        name = f"thumb:{image.hash}"
        if name not in drawn:
            drawn[name] = image_input.thumbnail(image)
        thumb = drawn[name]
        cells.append(f'<a href="image:{message_index}:{i}"><img src="{name}" width="{thumb.width()}"'
                     f' height="{thumb.height()}"></a> ')
    return f'<p style="margin-top:2px;margin-bottom:2px">{"".join(cells)}</p>'

"""The images waiting to go with the next message: the Attach button at the input box's right edge and a
row of thumbnails above it, each opening its image full size (app/chat/image_viewer.py) and each with a ×
button beside it that takes it off again.

Images only reach a model that has a vision projector loaded. Without one the
button is disabled and its tooltip says why and what to do; a paste or drop
of an image gets the same words on the status bar (:meth:`AttachStrip.add`
refuses), so the user never sends an image that would be dropped.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QObject, QPointF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPen, QPixmap, QPolygonF
from PySide6.QtWidgets import QAbstractScrollArea, QFileDialog, QHBoxLayout, QToolButton, QWidget

from app.chat import image_input, image_viewer
from app.chat.attachments import Attachment
from app.theme import Palette

NO_PROJECTOR = ("This model has no vision projector: load one with the model (Models → pair panel) "
                "to attach images.")
NO_MODEL = "No model is loaded: load one with a vision projector to attach images."
MAX_ATTACHED = 8  # images in one message; each takes hundreds of context cells or more
FILE_FILTER = "Images (*.png *.jpg *.jpeg *.gif *.bmp *.webp *.tif *.tiff)"


class AttachStrip(QWidget):
    """Thumbnails of the images attached to the message being written.

    Signals:
        sig_message(str, int): a status-bar message (why an image was refused) and how long to show it (ms).
        sig_changed(): an image was attached or taken off.
    """

    sig_message = Signal(str, int)
    sig_changed = Signal()

    def __init__(self, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.palette_ = palette
        self.images: list[Attachment] = []
        self.refusal = NO_MODEL  # why images cannot be attached now ("" when they can)
        self._box: QAbstractScrollArea | None = None  # the input box the Attach button sits in
        # an icon, not a word: the row beside the input box must not widen the window (layouts at 1000×700)
        self.attach_button = QToolButton()
        self.attach_button.setIcon(picture_icon(palette.muted))
        self.attach_button.setIconSize(QSize(20, 20))
        self.attach_button.setAccessibleName("Attach an image")
        self.attach_button.clicked.connect(self.choose_files)
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.addStretch(1)
        self.set_refusal(NO_MODEL)
        self.hide()

    def place_button_in(self, box: QAbstractScrollArea) -> None:
        """Put the Attach button in the input box's right edge, the text kept clear of it: inside the box,
        not beside it, so the row is no wider than the box alone (layouts at 1000×700, a window's sizes)."""
        self.attach_button.setParent(box)
        self._box = box
        side = self.attach_button.sizeHint().width() + 4
        box.setViewportMargins(0, 0, side, 0)
        box.installEventFilter(self)
        self._place()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self._box and event.type() == QEvent.Type.Resize:
            self._place()
        return False

    def _place(self) -> None:
        if self._box is not None:
            size = self.attach_button.sizeHint()
            self.attach_button.setGeometry(self._box.width() - size.width() - 4, 4, size.width(), size.height())

    def set_refusal(self, reason: str) -> None:
        """Images can be attached ("") or not, for ``reason``; images already attached stay (another model
        with a projector may be loaded before sending)."""
        self.refusal = reason
        self.attach_button.setEnabled(not reason)
        self.attach_button.setToolTip(reason or "Attach images to the message (or paste or drop them into the "
                                                "input box).")

    def choose_files(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach images", str(Path.home()), FILE_FILTER)
        found, refused = [], []
        for path in paths:
            try:
                found.append(image_input.from_file(path))
            except image_input.ImageRefused as exc:
                refused.append(str(exc))
        self.add(found, refused)

    def add(self, images: list[Attachment], refused: list[str] | None = None) -> bool:
        """Attach ``images`` (a paste, a drop, the file dialog); ``refused``: why others were not. False
        (the reason on the status bar) when none was attached."""
        problems = list(refused or [])
        if images and self.refusal:
            self.sig_message.emit(self.refusal, 6000)
            return False
        room = MAX_ATTACHED - len(self.images)
        if len(images) > room:
            problems.append(f"at most {MAX_ATTACHED} images go with one message")
            images = images[:max(0, room)]
        self.images += images
        if problems:
            self.sig_message.emit("Not attached: " + "; ".join(problems) + ".", 6000)
        if images:
            self._show()
        return bool(images)

    def set_images(self, images: list[Attachment]) -> None:
        """Show ``images`` as the attached ones (an edited message's)."""
        self.images = list(images)
        self._show()

    def remove(self, index: int) -> None:
        if 0 <= index < len(self.images):
            del self.images[index]
            self._show()

    def take(self) -> tuple[Attachment, ...]:
        """The attached images, taken off (the message was sent)."""
        images, self.images = tuple(self.images), []
        self._show()
        return images

    def _show(self) -> None:
        while self._row.count() > 1:  # the stretch stays last
            item = self._row.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        for i, image in enumerate(self.images):
            view = QToolButton()  # the thumbnail: a click (or Space) shows the image full size
            view.setIcon(QIcon(QPixmap.fromImage(image_input.thumbnail(image, 48))))
            view.setIconSize(QSize(48, 48))
            view.setToolTip(f"{image.mime}, {len(image.data) / 1024:,.0f} KiB: click to see it full size")
            view.setAccessibleName(f"View attached image {i + 1}")
            view.clicked.connect(lambda _checked=False, at=i: image_viewer.show_image(self, self.images, at))
            remove = QToolButton()
            remove.setText("×")
            remove.setToolTip("Take this image off the message")
            remove.setAccessibleName(f"Remove attached image {i + 1}")
            remove.clicked.connect(lambda _checked=False, at=i: self.remove(at))
            self._row.insertWidget(2 * i, view)
            self._row.insertWidget(2 * i + 1, remove, 0, Qt.AlignmentFlag.AlignTop)
        self.setVisible(bool(self.images))
        self.sig_changed.emit()


def picture_icon(colour: str) -> QIcon:
    """A framed picture (a hill and a sun): the attach button's icon, drawn here so no theme lacks it."""
    pixmap = QPixmap(40, 40)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(QPen(QColor(colour), 3))
    painter.drawRoundedRect(4, 7, 32, 26, 3, 3)
    painter.setBrush(QColor(colour))
    painter.drawPolygon(QPolygonF([QPointF(7, 31), QPointF(17, 18), QPointF(24, 26), QPointF(28, 22),
                                   QPointF(33, 31)]))
    painter.drawEllipse(QPointF(27, 14), 3, 3)
    painter.end()
    return QIcon(pixmap)

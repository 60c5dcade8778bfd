"""The load sheet's vision projector list: none, the projectors found beside the model (each with
the doctor's verdict on it), and "Choose a file…" last. The sheet checks a file before offering it."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QWidget

from app.load_plan import ProjectorOption

CHOOSE = "\0choose"  # the list's last item: a file dialog


class ProjectorBox(QComboBox):
    """Items' data: a projector's path, None for none, :data:`CHOOSE` for the file dialog."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.addItem("none (the model reads text only)", None)
        self.setToolTip("A vision projector (mmproj-*.gguf) lets the model read images attached in the chat. "
                        "It takes memory of its own.")
        self.options: dict[str, ProjectorOption] = {}

    @property
    def chosen(self) -> str | None:
        """The projector chosen (None: none)."""
        data = self.currentData()
        return data if isinstance(data, str) and data != CHOOSE else None

    def add_choose_item(self) -> None:
        self.addItem("Choose a file…", CHOOSE)

    def offer(self, option: ProjectorOption) -> None:
        """List ``option`` before "Choose a file…", its verdict as its tooltip (once)."""
        if option.path in self.options:
            return
        self.options[option.path] = option
        self.insertItem(self.count() - 1, option.label, option.path)
        self.setItemData(self.count() - 2, option.verdict, Qt.ItemDataRole.ToolTipRole)

    def show_choice(self, path: str | None) -> None:
        """Select ``path`` (offered already) and say what it is."""
        self.setCurrentIndex(max(0, self.findData(path)))
        option = self.options.get(path or "")
        self.setToolTip(option.verdict if option else "No vision projector: images cannot be attached.")

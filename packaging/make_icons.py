#!/usr/bin/env python3
"""Render assets/icons/mtp-studio.svg into the PNG sizes, the Windows .ico and the macOS .icns.

The SVG is the source; the rendered files are committed so a build needs no
renderer. Run again after editing the SVG:

    QT_QPA_PLATFORM=offscreen .venv/bin/python packaging/make_icons.py
"""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

ICONS = Path(__file__).resolve().parents[1] / "assets" / "icons"
SIZES = (16, 24, 32, 48, 64, 128, 256, 512)


def render(renderer: QSvgRenderer, size: int) -> QImage:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image


def main() -> int:
    _app = QGuiApplication(sys.argv[:1])
    renderer = QSvgRenderer(str(ICONS / "mtp-studio.svg"))
    if not renderer.isValid():
        print("error: assets/icons/mtp-studio.svg does not parse", file=sys.stderr)
        return 1
    for size in SIZES:
        path = ICONS / f"mtp-studio-{size}.png"
        if not render(renderer, size).save(str(path)):
            print(f"error: could not write {path}", file=sys.stderr)
            return 1
    # Qt's ico and icns writers take the largest image they support (256 for .ico, 512 for .icns).
    for name, size in (("mtp-studio.ico", 256), ("mtp-studio.icns", 512)):
        if not render(renderer, size).save(str(ICONS / name)):
            print(f"error: could not write {ICONS / name}", file=sys.stderr)
            return 1
    print(f"wrote {len(SIZES) + 2} files to {ICONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

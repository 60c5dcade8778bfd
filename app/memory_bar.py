"""The load sheet's memory bars: how much of this machine's RAM (or a GPU's) a load needs, green
to red as it nears and passes what there is."""

from __future__ import annotations

from PySide6.QtWidgets import QProgressBar

GIB = 2**30


def _bar_style(fraction: float) -> str:
    colour = "#3a9a5b" if fraction <= 0.8 else "#d08a1e" if fraction <= 1.0 else "#c8413b"
    return f"QProgressBar::chunk {{ background:{colour}; }}"


def fill_memory_bar(bar: QProgressBar, need: int, have: int | None, what: str) -> None:
    """Show ``need`` bytes against ``have`` (None or 0: unknown) of ``what``."""
    if not have:
        bar.setValue(0)
        bar.setFormat(f"{need / GIB:.2f} GiB ({what} unknown)")
        return
    fraction = need / have
    bar.setValue(int(min(1.0, fraction) * 1000))
    bar.setFormat(f"{need / GIB:.2f} of {have / GIB:.1f} GiB {what}")
    bar.setStyleSheet(_bar_style(fraction))
